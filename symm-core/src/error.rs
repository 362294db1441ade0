//! The one error type of symm-core and the backends.

use std::time::Duration;

use crate::types::DeviceType;

/// Everything that can go wrong in symmetric memory, named by what a caller can act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store or fd exchange under a rendezvous failed.
    #[error(transparent)]
    Store(#[from] symm_store::StoreError),
    /// No backend is registered (linked) for the device type.
    #[error("no symmetric memory backend registered for device type {0}; link the backend crate (call its `link()`)")]
    NoBackend(DeviceType),
    /// Two backends registered the same device type.
    #[error("duplicate backend registration for device type {device_type}: {first} and {second}")]
    DuplicateBackend {
        device_type: DeviceType,
        first: &'static str,
        second: &'static str,
    },
    /// No connectivity detector registered for (device type, link kind).
    #[error("no connectivity detector for device type {device_type}, link kind {link_kind:?}")]
    NoDetector { device_type: DeviceType, link_kind: String },
    /// Ranks disagree on something that must be equal (size, world size, pad size...).
    #[error("ranks disagree on {what}: {detail}")]
    Mismatch { what: &'static str, detail: String },
    /// A rank, channel, offset, size or shape is outside what the memory allows.
    #[error("{what} out of range: {value} (limit {limit})")]
    OutOfRange { what: &'static str, value: u64, limit: u64 },
    /// An offset or pointer is not aligned as the dtype or operation needs.
    #[error("misaligned {what}: {value} is not a multiple of {align}")]
    Misaligned { what: &'static str, value: u64, align: u64 },
    /// The dtype is not supported by this operation.
    #[error("dtype {dtype} not supported by {op}")]
    UnsupportedDType { dtype: String, op: &'static str },
    /// Invalid argument, described.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A wait (host or device) passed its deadline.
    #[error("timeout after {timeout:?} in {what}")]
    Timeout { what: String, timeout: Duration },
    /// A wait was aborted through the abort word.
    #[error("aborted: {0}")]
    Aborted(String),
    /// A peer rank died or left.
    #[error("peer rank {rank} lost: {reason}")]
    PeerLost { rank: usize, reason: String },
    /// A persistent allocation id is still held by a live tensor.
    #[error("persistent alloc_id {alloc_id} is in use by a live tensor")]
    AllocIdInUse { alloc_id: u64 },
    /// The ranks are not all on the same host.
    #[error("ranks are not on one host: {0}")]
    NotSameHost(String),
    /// Two ranks use the same device in a group that does not allow it
    /// ([`crate::GroupOptions::shared_devices`]).
    #[error(
        "ranks {a} and {b} share device {device}; build the group with GroupOptions {{ shared_devices: true, .. }} \
         (or SYMM_ALLOW_OVERLAPPING_DEVICES=1 for Group::new) to allow it"
    )]
    OverlappingDevices { a: usize, b: usize, device: String },
    /// Rendezvous has not happened for this allocation yet.
    #[error("allocation has not been rendezvoused")]
    NotRendezvoused,
    /// The group is unknown.
    #[error("unknown group {0:?}")]
    UnknownGroup(String),
    /// Out of memory on the device.
    #[error("out of memory on {device}: {detail}")]
    OutOfMemory { device: String, detail: String },
    /// A backend (driver, runtime, compiler) error.
    #[error("{backend} error in {call}: {detail}")]
    Backend {
        backend: &'static str,
        call: String,
        detail: String,
    },
    /// The backend or feature is not available on this machine (no driver, no GPU...).
    #[error("not available: {0}")]
    Unavailable(String),
    /// Operating system I/O error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
