//! All unsafe code of the host backend: memfd-backed regions mapped with
//! `mmap(MAP_SHARED)`, bounds-checked byte copies, and atomic views of words.
//!
//! Every access to mapped memory goes through atomics (relaxed for data, the
//! caller's orderings for pad words), so concurrent access by other ranks —
//! threads of this process or other processes mapping the same memfd — is
//! never a data race in Rust's memory model. Ordering between data and
//! signals comes from the release/acquire pad protocol (NOTE
//! [signal-pad-layout] in `symm_core::pad`).

use std::ffi::CString;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::sys::stat::{fstat, SFlag};
use symm_core::{check_range, Error, Result};

/// The system page size (4096 if `sysconf` cannot tell).
pub(crate) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| usize::try_from(p).ok())
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// Rounds `n` up to a multiple of the page size.
pub(crate) fn page_round(n: usize) -> Result<usize> {
    let p = page_size();
    n.checked_add(p - 1).map(|x| x & !(p - 1)).ok_or(Error::OutOfRange {
        what: "allocation size",
        value: n as u64,
        limit: (usize::MAX - p) as u64,
    })
}

fn os_err(call: &str, e: Errno) -> Error {
    match e {
        Errno::ENOMEM | Errno::ENOSPC | Errno::EFBIG => Error::OutOfMemory {
            device: "host".into(),
            detail: format!("{call}: {e}"),
        },
        Errno::EMFILE | Errno::ENFILE => Error::Backend {
            backend: "host",
            call: call.to_string(),
            detail: format!(
                "{} (RLIMIT_NOFILE soft limit {})",
                e.desc(),
                nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                    .map(|(soft, _)| soft.to_string())
                    .unwrap_or_else(|_| "unknown".into())
            ),
        },
        _ => Error::Backend {
            backend: "host",
            call: call.to_string(),
            detail: e.desc().to_string(),
        },
    }
}

/// One memfd mapped shared and read-write into this process. Unmapped on
/// drop; the fd (kept only where it is still needed for sending) closes too.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    fd: Option<OwnedFd>,
}

// SAFETY: a Region is a plain address range plus an fd; the range stays mapped
// for the Region's whole life and every access to it goes through atomics, so
// sharing or moving the handle between threads cannot race.
unsafe impl Send for Region {}
// SAFETY: as above: `&Region` only hands out atomic views and atomic copies.
unsafe impl Sync for Region {}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

fn map_shared(fd: BorrowedFd<'_>, len: NonZeroUsize) -> Result<NonNull<u8>> {
    // SAFETY: no address is requested, so the kernel picks a fresh range and no
    // existing mapping is replaced; the fd is valid for the duration of the call
    // and the mapping does not need it afterwards.
    let p = unsafe {
        mmap(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            fd,
            0,
        )
    }
    .map_err(|e| os_err(&format!("mmap of {len} bytes"), e))?;
    Ok(p.cast())
}

impl Region {
    /// Creates a memfd of `len` bytes (a multiple of the page size; zero
    /// filled by the kernel) and maps it.
    pub(crate) fn create(name: &str, len: usize) -> Result<Region> {
        let nz = NonZeroUsize::new(len).ok_or_else(|| Error::InvalidArgument("empty region".into()))?;
        if !len.is_multiple_of(page_size()) {
            return Err(Error::Misaligned {
                what: "region length",
                value: len as u64,
                align: page_size() as u64,
            });
        }
        let cname = CString::new(name.replace('\0', "_")).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        let fd = memfd_create(cname.as_c_str(), MFdFlags::MFD_CLOEXEC).map_err(|e| os_err("memfd_create", e))?;
        let off = i64::try_from(len).map_err(|_| Error::OutOfRange {
            what: "allocation size",
            value: len as u64,
            limit: i64::MAX as u64,
        })?;
        nix::unistd::ftruncate(&fd, off).map_err(|e| os_err(&format!("ftruncate to {len} bytes"), e))?;
        let ptr = map_shared(fd.as_fd(), nz)?;
        Ok(Region { ptr, len, fd: Some(fd) })
    }

    /// Maps a memfd received from a peer after checking that it is a regular
    /// file of exactly `len` bytes. The fd is closed once mapped.
    pub(crate) fn from_fd(fd: OwnedFd, len: usize) -> Result<Region> {
        let nz = NonZeroUsize::new(len).ok_or_else(|| Error::InvalidArgument("empty region".into()))?;
        let st = fstat(&fd).map_err(|e| os_err("fstat", e))?;
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind != SFlag::S_IFREG {
            return Err(Error::Mismatch {
                what: "received fd",
                detail: format!("not a regular file (mode {:o})", st.st_mode),
            });
        }
        if u64::try_from(st.st_size).ok() != Some(len as u64) {
            return Err(Error::Mismatch {
                what: "received fd",
                detail: format!("size {} bytes, expected {len}", st.st_size),
            });
        }
        let ptr = map_shared(fd.as_fd(), nz)?;
        drop(fd);
        Ok(Region { ptr, len, fd: None })
    }

    /// The memfd, if this region still holds it (regions it created do).
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn atomic_u8(&self, offset: usize) -> &AtomicU8 {
        debug_assert!(offset < self.len);
        // SAFETY: callers pass offset < len, so the byte lies inside the live
        // mapping, which outlives the returned borrow of `self`; every access
        // to the mapping is atomic.
        unsafe { &*(self.ptr.as_ptr().add(offset) as *const AtomicU8) }
    }

    fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: callers pass an 8-aligned offset with offset + 8 <= len; the
        // base is page aligned, so the word is aligned and inside the live
        // mapping, which outlives the returned borrow; every access is atomic.
        unsafe { &*(self.ptr.as_ptr().add(offset) as *const AtomicU64) }
    }

    /// An atomic view of the `u32` at byte `offset` (4-aligned, in bounds).
    pub(crate) fn word(&self, offset: usize) -> Result<&AtomicU32> {
        check_range("pad word", offset, 4, self.len)?;
        if !offset.is_multiple_of(4) {
            return Err(Error::Misaligned {
                what: "pad word offset",
                value: offset as u64,
                align: 4,
            });
        }
        // SAFETY: checked above: the word is 4-aligned (page-aligned base) and
        // inside the live mapping, which outlives the returned borrow; every
        // access to the mapping is atomic.
        Ok(unsafe { &*(self.ptr.as_ptr().add(offset) as *const AtomicU32) })
    }

    /// Copies `out.len()` bytes starting at `offset` (relaxed atomic loads).
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range("region read", offset, out.len(), self.len)?;
        let mut i = 0;
        while i < out.len() {
            let at = offset + i;
            if at.is_multiple_of(8) && out.len() - i >= 8 {
                let w = self.atomic_u64(at).load(Ordering::Relaxed);
                out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
                i += 8;
            } else {
                out[i] = self.atomic_u8(at).load(Ordering::Relaxed);
                i += 1;
            }
        }
        Ok(())
    }

    /// Copies `data` to `offset` (relaxed atomic stores).
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range("region write", offset, data.len(), self.len)?;
        let mut i = 0;
        while i < data.len() {
            let at = offset + i;
            if at.is_multiple_of(8) && data.len() - i >= 8 {
                let mut w = [0u8; 8];
                w.copy_from_slice(&data[i..i + 8]);
                self.atomic_u64(at).store(u64::from_ne_bytes(w), Ordering::Relaxed);
                i += 8;
            } else {
                self.atomic_u8(at).store(data[i], Ordering::Relaxed);
                i += 1;
            }
        }
        Ok(())
    }

    /// Fills `[offset, offset + len)` with `byte`, then a release fence so
    /// that a later release store publishing this region orders after it.
    pub(crate) fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        check_range("region fill", offset, len, self.len)?;
        let word = u64::from_ne_bytes([byte; 8]);
        let mut at = offset;
        let end = offset + len;
        while at < end {
            if at.is_multiple_of(8) && end - at >= 8 {
                self.atomic_u64(at).store(word, Ordering::Relaxed);
                at += 8;
            } else {
                self.atomic_u8(at).store(byte, Ordering::Relaxed);
                at += 1;
            }
        }
        std::sync::atomic::fence(Ordering::Release);
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly the range mapped in `map_shared`; it is
        // unmapped only here, and every reference into it borrows `self`, so
        // none outlives this call. A failure leaves the range mapped (leaked),
        // which is safe.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_write_read_and_share() {
        let len = page_round(10_000).unwrap();
        assert_eq!(len % page_size(), 0);
        let a = Region::create("symm-test", len).unwrap();
        let mut z = vec![1u8; 100];
        a.read(len - 100, &mut z).unwrap();
        assert!(z.iter().all(|&b| b == 0), "memfd starts zeroed");
        let data: Vec<u8> = (0..77u8).collect();
        a.write(3, &data).unwrap();
        let dup = a.fd().unwrap().try_clone_to_owned().unwrap();
        let b = Region::from_fd(dup, len).unwrap();
        assert_ne!(a.addr(), b.addr());
        let mut out = vec![0u8; 77];
        b.read(3, &mut out).unwrap();
        assert_eq!(out, data);
        b.word(16).unwrap().store(0xdead_beef, Ordering::Release);
        assert_eq!(a.word(16).unwrap().load(Ordering::Acquire), 0xdead_beef);
        assert!(a.word(18).is_err());
        assert!(a.word(len - 2).is_err());
        assert!(a.read(len - 3, &mut [0u8; 4]).is_err());
        assert!(a.write(usize::MAX, &[1]).is_err());
        a.fill(0, 40, 0xab).unwrap();
        let mut f = [0u8; 41];
        b.read(0, &mut f).unwrap();
        assert!(f[..40].iter().all(|&x| x == 0xab) && f[40] == 37);
    }

    #[test]
    fn wrong_size_fd_is_rejected() {
        let len = page_size() * 2;
        let a = Region::create("symm-test", len).unwrap();
        let dup = a.fd().unwrap().try_clone_to_owned().unwrap();
        assert!(matches!(Region::from_fd(dup, len * 2), Err(Error::Mismatch { .. })));
        assert!(Region::create("x", 100).is_err());
    }

    #[test]
    fn refused_sizes_are_out_of_memory() {
        // Past any user address space (47-bit mmap), so refused even where
        // memory is overcommitted: an error naming the size, never an abort.
        let len = 1usize << 50;
        match Region::create("symm-test-huge", len) {
            Err(Error::OutOfMemory { device, detail }) => {
                assert_eq!(device, "host");
                assert!(detail.contains(&len.to_string()), "{detail}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        let huge = page_round(usize::MAX / 2).unwrap();
        assert!(matches!(
            Region::create("symm-test-huge", huge),
            Err(Error::OutOfMemory { .. }) | Err(Error::OutOfRange { .. })
        ));
        assert!(matches!(page_round(usize::MAX), Err(Error::OutOfRange { .. })));
    }
}
