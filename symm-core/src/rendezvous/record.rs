//! The record every rank publishes at rendezvous ([`Record`], its text encoding, a backend's
//! own fields through [`RecordExt`]), the checks every rank runs on all records alike
//! ([`check_records`], [`same_process`]), and the identities a record carries (the process
//! nonce, the per-rendezvous key).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use symm_store::StoreError;

use crate::agree::{check_equal, check_world_size, host_id, pid_namespace};
use crate::connectivity::{check_device_sharing, check_same_host};
use crate::error::{Error, Result};
use crate::pad::SIGNAL_PAD_SIZE;

/// A backend's own fields of the record (CUDA: the device's PCI bus id, ordinal and hardware
/// queues), after the common ones, and the checks on them.
pub trait RecordExt: Clone + std::fmt::Debug + PartialEq {
    /// The fields, in order (newlines are replaced by spaces when encoded).
    fn fields(&self) -> Vec<String>;
    /// Parses what [`fields`](RecordExt::fields) gave; `None` when `fields` are not this
    /// extension's (count or syntax).
    fn parse(fields: &[&str]) -> Option<Self>;
    /// The backend's checks on every rank's record, run after the common ones
    /// ([`check_records`]); `sharers[r]` is how many ranks use rank r's device. Like those,
    /// identical on every rank.
    fn check(_records: &[Record<Self>], _sharers: &[usize]) -> Result<()> {
        Ok(())
    }
}

/// No fields of the backend's own (the host backend).
impl RecordExt for () {
    fn fields(&self) -> Vec<String> {
        Vec::new()
    }
    fn parse(fields: &[&str]) -> Option<()> {
        fields.is_empty().then_some(())
    }
}

/// What every rank publishes at rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<E> {
    /// The world size of the rank's group.
    pub world: usize,
    /// Bytes of the buffer asked for.
    pub buffer_size: usize,
    /// Bytes of the signal pad ([`crate::pad::SIGNAL_PAD_SIZE`]).
    pub pad_size: usize,
    /// Bytes of the whole allocation (buffer, pad and whatever the backend adds, rounded to
    /// its granularity): what a peer imports and maps.
    pub total: usize,
    /// [`crate::agree::host_id`].
    pub host: String,
    /// The device's identity: ranks naming the same device share it
    /// ([`check_device_sharing`]).
    pub device: String,
    pub pid: u32,
    /// [`crate::agree::pid_namespace`].
    pub pid_ns: String,
    /// [`process_nonce`].
    pub nonce: u64,
    /// Names this rank's handle in the process-wide table ([`next_key`]).
    pub key: u64,
    /// The group's [`GroupOptions::shared_devices`](crate::GroupOptions).
    pub shared_ok: bool,
    /// The backend's own fields.
    pub extra: E,
}

/// This rank's values of its [`Record`] that only the backend knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRecord<E> {
    pub buffer_size: usize,
    pub total: usize,
    pub device: String,
    pub extra: E,
}

impl<E> Record<E> {
    /// The record of a rank of this process in a world of `world`: `local`'s values, `key`,
    /// the group's `shared_ok`, and what the process knows (the pad size, host, pid, pid
    /// namespace, nonce).
    pub fn of_this_process(world: usize, local: LocalRecord<E>, key: u64, shared_ok: bool) -> Record<E> {
        Record {
            world,
            buffer_size: local.buffer_size,
            pad_size: SIGNAL_PAD_SIZE,
            total: local.total,
            host: host_id(),
            device: local.device,
            pid: std::process::id(),
            pid_ns: pid_namespace(),
            nonce: process_nonce(),
            key,
            shared_ok,
            extra: local.extra,
        }
    }
}

/// First line of every record: the protocol's version.
const MAGIC: &str = "symm-rdzv-4";
/// Lines before the extension: the magic, the backend's name and the eleven common fields.
const COMMON_LINES: usize = 13;

impl<E: RecordExt> Record<E> {
    /// Newline-separated text: the magic, `backend`, the common fields, the extension's
    /// (every field cleaned of newlines).
    pub fn encode(&self, backend: &str) -> Vec<u8> {
        let clean = |s: &str| s.replace(['\n', '\r'], " ");
        let mut lines = vec![
            MAGIC.to_string(),
            clean(backend),
            self.world.to_string(),
            self.buffer_size.to_string(),
            self.pad_size.to_string(),
            self.total.to_string(),
            clean(&self.host),
            clean(&self.device),
            self.pid.to_string(),
            clean(&self.pid_ns),
            self.nonce.to_string(),
            self.key.to_string(),
            u8::from(self.shared_ok).to_string(),
        ];
        lines.extend(self.extra.fields().iter().map(|f| clean(f)));
        lines.join("\n").into_bytes()
    }

    /// Parses what rank `rank` published; [`Error::Mismatch`] when it is not a record of
    /// `backend` in this version.
    pub fn decode(backend: &str, rank: usize, bytes: &[u8]) -> Result<Record<E>> {
        let bad = || Error::Mismatch {
            what: "rendezvous record",
            detail: format!(
                "rank {rank} published a record the {backend} backend cannot read (another backend or version?)"
            ),
        };
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let f: Vec<&str> = text.split('\n').collect();
        if f.len() < COMMON_LINES || f[0] != MAGIC || f[1] != backend {
            return Err(bad());
        }
        let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
        let size = |s: &str| num(s).and_then(|v| usize::try_from(v).map_err(|_| bad()));
        Ok(Record {
            world: size(f[2])?,
            buffer_size: size(f[3])?,
            pad_size: size(f[4])?,
            total: size(f[5])?,
            host: f[6].to_string(),
            device: f[7].to_string(),
            pid: u32::try_from(num(f[8])?).map_err(|_| bad())?,
            pid_ns: f[9].to_string(),
            nonce: num(f[10])?,
            key: num(f[11])?,
            shared_ok: match f[12] {
                "0" => false,
                "1" => true,
                _ => return Err(bad()),
            },
            extra: E::parse(&f[COMMON_LINES..]).ok_or_else(bad)?,
        })
    }
}

/// Checks the records of all ranks (identical on every rank, so every rank fails the same
/// way, before anything is mapped): world size (also against `world`), signal-pad size,
/// buffer size, allocation size, host, device sharing ([`check_device_sharing`]; with
/// `one_process`, ranks that share a device must be threads of one process, as GPU backends
/// need), then the backend's own ([`RecordExt::check`]). Returns how many ranks use each
/// rank's device.
pub fn check_records<E: RecordExt>(world: usize, records: &[Record<E>], one_process: bool) -> Result<Vec<usize>> {
    check_world_size(world, records, |r| r.world)?;
    check_equal("signal pad size", records, |r| r.pad_size)?;
    check_equal("buffer size", records, |r| r.buffer_size)?;
    check_equal("allocation size (granularity)", records, |r| r.total)?;
    check_same_host(&records.iter().map(|r| r.host.clone()).collect::<Vec<_>>())?;
    let processes: Vec<String> = records
        .iter()
        .map(|r| format!("{}/{}/{}", r.pid, r.pid_ns, r.nonce))
        .collect();
    let sharers = check_device_sharing(
        &records.iter().map(|r| r.device.clone()).collect::<Vec<_>>(),
        &records.iter().map(|r| r.shared_ok).collect::<Vec<_>>(),
        one_process.then_some(processes.as_slice()),
    )?;
    E::check(records, &sharers)?;
    Ok(sharers)
}

/// Which ranks share rank `rank`'s process (same pid, pid namespace and nonce).
pub fn same_process<E>(records: &[Record<E>], rank: usize) -> Vec<bool> {
    let me = &records[rank];
    records
        .iter()
        .map(|r| r.pid == me.pid && r.nonce == me.nonce && r.pid_ns == me.pid_ns)
        .collect()
}

/// The rank a store error says is missing or lost, if any.
pub fn missing_rank(e: &StoreError) -> Option<usize> {
    match e {
        StoreError::MissingRanks { missing, .. } => missing.first().copied(),
        StoreError::PeerLost { rank, .. } => Some(*rank),
        _ => None,
    }
}

/// A key unique in this process: names one rendezvous's handle in the process-wide table.
pub fn next_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A random number drawn once per process (to tell processes apart even when pids are reused
/// or live in other namespaces).
pub fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| {
        let mut b = [0u8; 8];
        if std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
            .is_err()
        {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            b = (t ^ (u64::from(std::process::id()) << 32)).to_le_bytes();
        }
        u64::from_le_bytes(b)
    })
}
