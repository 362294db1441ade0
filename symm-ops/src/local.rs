//! Single-process groups: one communicator per device (or per CUDA stream) of this process, built
//! together with no store to set up (cudarc's `Comm::from_devices` is the model). Each rank's
//! setup runs on a thread of its own, since setup is collective; the communicators come back to
//! the caller, who moves each into the thread that uses it (`Communicator` is `Send + Sync`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use symm_core::{Device, Error, Group, GroupOptions, Result};
use symm_store::HashStore;

use crate::comm::{CommConfig, Communicator};

/// How long the in-process store waits when the config names no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A group name no other single-process group of this process uses.
fn fresh_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("local-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Builds `n` communicators of one group, rank `r` by `build(group_r, r)` on a thread of its own.
/// `shared`: ranks share devices (NOTE [shared-device]). The first error is returned (the other
/// ranks' setup then fails or is dropped with it).
pub(crate) fn build_group<F>(n: usize, config: &CommConfig, shared: bool, build: F) -> Result<Vec<Communicator>>
where
    F: Fn(&Arc<Group>, usize) -> Result<Communicator> + Sync,
{
    if n == 0 {
        return Err(Error::InvalidArgument(
            "a single-process group needs at least one device or stream".into(),
        ));
    }
    let store = HashStore::new(config.timeout.unwrap_or(DEFAULT_TIMEOUT));
    let name = fresh_name();
    let options = GroupOptions {
        shared_devices: shared,
        ..GroupOptions::default()
    };
    let results: Vec<Result<Communicator>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                let (store, name, options, build) = (store.clone(), &name, options, &build);
                s.spawn(move || {
                    let group = Group::with_options(name.as_str(), r, n, store, options)?;
                    build(&group, r)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::InvalidArgument("a rank's communicator setup panicked".into())))
            })
            .collect()
    });
    results.into_iter().collect()
}

impl Communicator {
    /// One communicator per device of this process, all of one group, built together with no
    /// store to set up: rank `r` runs on `devices[r]` (host devices for the host engine, CUDA
    /// devices each on a new stream of its primary context). Devices may repeat (ranks sharing
    /// a device, NOTE [shared-device]). Move each communicator into the thread that uses it.
    pub fn for_devices(devices: &[Device], config: CommConfig) -> Result<Vec<Communicator>> {
        let shared = (1..devices.len()).any(|i| devices[..i].contains(&devices[i]));
        build_group(devices.len(), &config, shared, |g, r| {
            Communicator::new(g, devices[r], config.clone())
        })
    }

    /// One communicator per CUDA stream, all of one group, built together with no store to set
    /// up: rank `r`'s ops run on `streams[r]`. Streams of one device make ranks that share it
    /// (NOTE [shared-device]). Move each communicator into the thread that uses it.
    #[cfg(feature = "cuda")]
    pub fn for_streams(streams: &[Arc<cudarc::driver::CudaStream>], config: CommConfig) -> Result<Vec<Communicator>> {
        let ordinals: Vec<usize> = streams.iter().map(|s| s.context().ordinal()).collect();
        let shared = (1..ordinals.len()).any(|i| ordinals[..i].contains(&ordinals[i]));
        build_group(streams.len(), &config, shared, |g, r| {
            Communicator::with_stream(g, streams[r].clone(), config.clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communicators_move_between_threads() {
        fn send<T: Send>() {}
        send::<Communicator>();
    }

    #[test]
    fn an_empty_group_is_an_error() {
        assert!(matches!(
            Communicator::for_devices(&[], CommConfig::default()),
            Err(Error::InvalidArgument(_))
        ));
    }
}
