//! The [`SymmetricAllocator`] trait and the per-device-type registry.
//!
//! A backend registers itself with plain data through `inventory`:
//!
//! ```text
//! inventory::submit! {
//!     symm_core::BackendRegistration {
//!         device_type: symm_core::DeviceType::Cuda,
//!         name: "symm-cuda",
//!         make: make_allocator,
//!     }
//! }
//! ```
//!
//! The lookup is built lazily on first use; two registrations of one device
//! type are an error ([`Error::DuplicateBackend`]), reported on every lookup.
//! A backend crate must be linked into the final binary for its registration
//! to be seen: each backend exposes a `link()` function for that.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::group::Group;
use crate::memory::SymmetricMemory;
use crate::types::{Device, DeviceType};

/// One rank's local symmetric allocation, before or after rendezvous.
/// Dropping the last handle frees it (unmapping peers too).
pub trait Allocation: Send + Sync + 'static {
    /// Local address of the buffer.
    fn ptr(&self) -> u64;
    /// Usable size in bytes (PyTorch's `get_alloc_size`).
    fn size(&self) -> usize;
    fn device(&self) -> Device;
    fn group(&self) -> &Arc<Group>;
    /// Exchanges handles with every rank of the group and maps the peers'
    /// buffers. Collective; idempotent: later calls return the same memory.
    fn rendezvous(&self, timeout: Duration) -> Result<Arc<dyn SymmetricMemory>>;
    /// The memory if rendezvous completed (PyTorch's `is_rendezvous_completed`).
    fn symmetric_memory(&self) -> Option<Arc<dyn SymmetricMemory>>;
    fn as_any(&self) -> &dyn Any;
}

/// A backend's allocator (PyTorch's `SymmetricMemoryAllocator`).
pub trait SymmetricAllocator: Send + Sync + 'static {
    fn device_type(&self) -> DeviceType;
    fn name(&self) -> &'static str;
    /// Allocates `size` bytes (plus a signal pad) on `device` for `group`.
    fn alloc(&self, size: usize, device: Device, group: &Arc<Group>) -> Result<Arc<dyn Allocation>>;
    /// Frees an allocation; an error if other handles still hold it.
    fn free(&self, alloc: Arc<dyn Allocation>) -> Result<()> {
        match Arc::strong_count(&alloc) {
            1 => {
                drop(alloc);
                Ok(())
            }
            n => Err(Error::InvalidArgument(format!(
                "free: allocation still has {} other handles",
                n - 1
            ))),
        }
    }
    /// Number of devices of this type the backend can use on this machine
    /// (for test gating and launchers). The default says the backend does not
    /// report it.
    fn device_count(&self) -> Result<usize> {
        Err(Error::Unavailable(format!(
            "backend {} does not report a device count",
            self.name()
        )))
    }
    /// Whether ranks that are threads of this process can share one device here (a group with
    /// [`GroupOptions::shared_devices`](crate::GroupOptions)); `Err(Error::Unavailable)` says
    /// what is missing (CUDA: the hardware work queues, NOTE [co-residency]). Rendezvous makes
    /// the same check on every rank's record; this is for launchers and test gates.
    fn shared_device_support(&self) -> Result<()> {
        Ok(())
    }
    /// Whether the backend can create multicast objects. symm never uses
    /// NVLink multicast; backends return false.
    fn has_multicast_support(&self, _device: Device) -> bool {
        false
    }
}

/// A backend's registration: plain data, submitted with `inventory::submit!`.
pub struct BackendRegistration {
    pub device_type: DeviceType,
    pub name: &'static str,
    pub make: fn() -> Result<Arc<dyn SymmetricAllocator>>,
}

inventory::collect!(BackendRegistration);

type Lookup =
    std::result::Result<HashMap<DeviceType, &'static BackendRegistration>, (DeviceType, &'static str, &'static str)>;

fn lookup() -> &'static Lookup {
    static LOOKUP: OnceLock<Lookup> = OnceLock::new();
    LOOKUP.get_or_init(|| build_lookup(inventory::iter::<BackendRegistration>.into_iter()))
}

fn build_lookup<'a>(
    regs: impl Iterator<Item = &'a BackendRegistration>,
) -> std::result::Result<HashMap<DeviceType, &'a BackendRegistration>, (DeviceType, &'static str, &'static str)> {
    let mut map: HashMap<DeviceType, &BackendRegistration> = HashMap::new();
    for r in regs {
        if let Some(prev) = map.insert(r.device_type, r) {
            return Err((r.device_type, prev.name, r.name));
        }
    }
    Ok(map)
}

/// Device types with a registered backend.
pub fn registered_device_types() -> Result<Vec<DeviceType>> {
    match lookup() {
        Ok(m) => {
            let mut v: Vec<_> = m.keys().copied().collect();
            v.sort();
            Ok(v)
        }
        Err((d, a, b)) => Err(Error::DuplicateBackend {
            device_type: *d,
            first: a,
            second: b,
        }),
    }
}

/// The allocator for `device_type`, built once per process.
pub fn get_allocator(device_type: DeviceType) -> Result<Arc<dyn SymmetricAllocator>> {
    static BUILT: OnceLock<Mutex<HashMap<DeviceType, Arc<dyn SymmetricAllocator>>>> = OnceLock::new();
    let reg = match lookup() {
        Ok(m) => *m.get(&device_type).ok_or(Error::NoBackend(device_type))?,
        Err((d, a, b)) => {
            return Err(Error::DuplicateBackend {
                device_type: *d,
                first: a,
                second: b,
            })
        }
    };
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(a) = built.get(&device_type) {
        return Ok(a.clone());
    }
    let a = (reg.make)()?;
    built.insert(device_type, a.clone());
    Ok(a)
}

/// Whether a backend is registered for `device_type` (PyTorch's `has_allocator`).
pub fn has_allocator(device_type: DeviceType) -> bool {
    matches!(lookup(), Ok(m) if m.contains_key(&device_type))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fail() -> Result<Arc<dyn SymmetricAllocator>> {
        Err(Error::Unavailable("test".into()))
    }

    #[test]
    fn duplicates_rejected() {
        let regs = [
            BackendRegistration {
                device_type: DeviceType::Host,
                name: "a",
                make: fail,
            },
            BackendRegistration {
                device_type: DeviceType::Cuda,
                name: "b",
                make: fail,
            },
            BackendRegistration {
                device_type: DeviceType::Host,
                name: "c",
                make: fail,
            },
        ];
        let err = build_lookup(regs.iter()).err();
        assert_eq!(err, Some((DeviceType::Host, "a", "c")));
        assert_eq!(build_lookup(regs[..2].iter()).map(|m| m.len()).ok(), Some(2));
    }

    #[test]
    fn unregistered_type_is_an_error() {
        // symm-core's own tests link no backend.
        assert!(matches!(
            get_allocator(DeviceType::Rocm),
            Err(Error::NoBackend(DeviceType::Rocm))
        ));
        assert!(!has_allocator(DeviceType::Rocm));
    }
}
