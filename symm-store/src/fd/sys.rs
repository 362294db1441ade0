//! The only unsafe code of the crate: `recvmsg(2)` with `SCM_RIGHTS` parsing.
//!
//! nix's `RecvMsg::cmsgs` refuses to iterate when `MSG_CTRUNC` is set, which would leak
//! the descriptors the kernel did install; here every descriptor that arrived is wrapped
//! in an [`OwnedFd`] at once (so it is closed when dropped), whatever else went wrong.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `SCM_MAX_FD` in the Linux kernel: the most descriptors one message can carry.
const MAX_FDS_PER_MESSAGE: usize = 253;

/// What one `recvmsg` returned.
#[derive(Debug)]
pub(crate) struct Received {
    /// Bytes of normal data (0 = end of stream).
    pub bytes: usize,
    /// Every descriptor received (already close-on-exec).
    pub fds: Vec<OwnedFd>,
    /// `MSG_CTRUNC` was set: some control data (descriptors) did not arrive.
    pub truncated: bool,
    /// Control messages other than `SCM_RIGHTS`.
    pub other_cmsgs: usize,
}

/// One non-blocking `recvmsg` with `MSG_CMSG_CLOEXEC`, room for the most descriptors a
/// message can carry, and every received descriptor owned.
pub(crate) fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Received> {
    let payload = u32::try_from(MAX_FDS_PER_MESSAGE * std::mem::size_of::<libc::c_int>())
        .map_err(|_| io::Error::other("control buffer size overflow"))?;
    // SAFETY: CMSG_SPACE is a pure arithmetic macro on its argument.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all-zero bytes are a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `iov` (valid for `buf.len()` writable bytes) and at `cbuf`
    // (valid for `space` bytes); both outlive the call; the fd is a borrowed open socket.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    let mut other_cmsgs = 0;
    // SAFETY: `msg` was filled in by a successful recvmsg; CMSG_FIRSTHDR only reads its
    // control fields and returns null or a pointer into `cbuf`.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` is non-null and points at a cmsghdr inside `cbuf` (aligned: the
        // kernel lays headers out at CMSG_ALIGN offsets of an 8-byte aligned buffer).
        let hdr = unsafe { &*cmsg };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_DATA computes the address just past the header, inside `cbuf`.
            let data = unsafe { libc::CMSG_DATA(cmsg) };
            let header_len = (data as usize).saturating_sub(cmsg as usize);
            let len = (hdr.cmsg_len as usize).saturating_sub(header_len);
            let end_of_buf = (cbuf.as_ptr() as usize).saturating_add(space);
            let len = len.min(end_of_buf.saturating_sub(data as usize));
            let count = len / std::mem::size_of::<libc::c_int>();
            for i in 0..count {
                // SAFETY: `i < count` keeps the read inside this message's data, which lies
                // inside `cbuf`; read_unaligned copes with any alignment.
                let raw = unsafe { std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i)) };
                if raw >= 0 {
                    // SAFETY: the kernel just installed `raw` in our table for this message;
                    // nothing else owns it, so taking ownership (and closing on drop) is sound.
                    fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
                }
            }
        } else {
            other_cmsgs += 1;
        }
        // SAFETY: `cmsg` is a valid header of `msg`'s control buffer; CMSG_NXTHDR returns
        // the next header inside the buffer or null.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok(Received {
        bytes: n as usize,
        fds,
        truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
        other_cmsgs,
    })
}
