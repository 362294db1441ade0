//! [`CommConfig`]: how a communicator is set up, and what every rank must agree on.

use super::*;

/// Default size of the persistent symmetric staging buffer (10 MiB, as
/// PyTorch's IntraNodeComm).
pub const DEFAULT_STAGING_BYTES: usize = 10 * 1024 * 1024;

/// How a [`Communicator`] is set up. Every rank must pass the same values
/// (checked at setup: ranks that selected different algorithms would
/// deadlock).
///
/// Built with [`CommConfig::default`] and the `with_*` setters (the struct is
/// `#[non_exhaustive]`: fields may be added).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CommConfig {
    /// Bytes of the persistent symmetric staging buffer plain inputs go
    /// through (in chunks when larger). Default 10 MiB.
    pub staging_bytes: usize,
    /// Bound on every wait of an op (device waits included). `None`: the
    /// group's timeout (its store's).
    pub timeout: Option<Duration>,
    /// The selection table's thresholds. `None`: the defaults for the
    /// engine and world size ([`SelectionThresholds::defaults`]).
    pub selection: Option<SelectionThresholds>,
    /// Force an engine instead of picking one from the device type and
    /// topology (`Nccl` on a CUDA group skips symmetric memory entirely).
    pub force_engine: Option<EngineKind>,
    /// Create the NCCL fallback (CUDA groups). Default true.
    pub nccl: bool,
    /// Launch the symmetric-memory kernels with programmatic dependent
    /// launch (CUDA, compute capability 9.0+: each op's kernel is
    /// scheduled while the kernel ahead of it on the stream still runs;
    /// `symm_cuda::collectives::CollectivesConfig::pdl`). `None`: the
    /// default: on, unless the `SYMM_PDL` environment variable is `0`.
    /// Ranks may differ in it.
    pub pdl: Option<bool>,
    /// Largest all-reduce (and all-gather) message of the Lamport kernels, in bytes: each rank
    /// holds three buffers of it per peer (`symm_cuda::collectives::CollectivesConfig::lamport_bytes`).
    /// `None`: 16 MiB for two ranks (48 MiB of buffers), 16 MiB / (world - 1) above; `Some(0)`
    /// turns the Lamport kernels off (the sizes go to the next algorithm in the table).
    pub lamport_bytes: Option<usize>,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig {
            staging_bytes: DEFAULT_STAGING_BYTES,
            timeout: None,
            selection: None,
            force_engine: None,
            nccl: true,
            pdl: None,
            lamport_bytes: None,
        }
    }
}

/// A builder in all but name: each `with_*` sets one field and returns the config, starting from
/// [`CommConfig::default`], e.g. `CommConfig::default().with_timeout(t).with_nccl(false)`.
impl CommConfig {
    /// [`Self::staging_bytes`].
    pub fn with_staging_bytes(mut self, bytes: usize) -> Self {
        self.staging_bytes = bytes;
        self
    }
    /// [`Self::timeout`].
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
    /// [`Self::selection`].
    pub fn with_selection(mut self, thresholds: SelectionThresholds) -> Self {
        self.selection = Some(thresholds);
        self
    }
    /// [`Self::force_engine`].
    pub fn with_engine(mut self, engine: EngineKind) -> Self {
        self.force_engine = Some(engine);
        self
    }
    /// [`Self::nccl`].
    pub fn with_nccl(mut self, nccl: bool) -> Self {
        self.nccl = nccl;
        self
    }
    /// [`Self::pdl`].
    pub fn with_pdl(mut self, pdl: bool) -> Self {
        self.pdl = Some(pdl);
        self
    }
    /// [`Self::lamport_bytes`].
    pub fn with_lamport_bytes(mut self, bytes: usize) -> Self {
        self.lamport_bytes = Some(bytes);
        self
    }
}

impl CommConfig {
    /// What every rank must agree on: this config and the group's options.
    pub(super) fn fingerprint(&self, group: &Group) -> String {
        format!(
            "staging={} lamport={:?} selection={:?} force={:?} nccl={} shared_devices={}",
            self.staging_bytes,
            self.lamport_bytes,
            self.selection,
            self.force_engine,
            self.nccl,
            group.options().shared_devices
        )
    }
}
