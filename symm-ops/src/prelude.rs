//! What a program using symm-ops needs, in one import: `use symm_ops::prelude::*;`.

pub use crate::{
    AllGatherAlgo, AllReduceAlgo, Buf, BufMut, CommConfig, Communicator, Element, EngineKind, EpilogueAlgo, OnStream,
    ReduceScatterAlgo, RmsNorm, SelectionThresholds, SymmBuffer,
};
pub use symm_core::{DType, Device, DeviceType, Error, Group, ReduceOp, Result, Scalar};

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_builder_sets_every_field() {
        let t = SelectionThresholds::defaults(EngineKind::Host, 2);
        let c = CommConfig::default()
            .with_staging_bytes(4096)
            .with_timeout(Duration::from_secs(3))
            .with_selection(t)
            .with_engine(EngineKind::Host)
            .with_nccl(false)
            .with_pdl(true)
            .with_lamport_bytes(1 << 20);
        assert_eq!(c.staging_bytes, 4096);
        assert_eq!(c.timeout, Some(Duration::from_secs(3)));
        assert_eq!(c.selection, Some(t));
        assert_eq!(c.force_engine, Some(EngineKind::Host));
        assert!(!c.nccl);
        assert_eq!(c.pdl, Some(true));
        assert_eq!(c.lamport_bytes, Some(1 << 20));
    }
}
