//! The CUDA backend's own fields of the rendezvous record ([`CudaExt`]: PCI bus id, ordinal,
//! hardware work queues) and its check on them (NOTE [co-residency]). The record's common
//! fields, their encoding and every other check are `symm_core::rendezvous`'s.

#![forbid(unsafe_code)]

use symm_core::rendezvous::{Record, RecordExt};
use symm_core::{check_shared_queues, Result};

/// What a CUDA rank adds to its rendezvous record (the device's UUID is the record's
/// `device`, as `GPU-<uuid>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaExt {
    pub pci_bus_id: String,
    pub ordinal: usize,
    /// The hardware work queues of the rank's process ([`crate::knobs::hw_queues`]).
    pub hw_queues: u32,
}

impl RecordExt for CudaExt {
    fn fields(&self) -> Vec<String> {
        vec![
            self.pci_bus_id.clone(),
            self.ordinal.to_string(),
            self.hw_queues.to_string(),
        ]
    }

    fn parse(fields: &[&str]) -> Option<CudaExt> {
        match fields {
            [pci, ordinal, queues] => Some(CudaExt {
                pci_bus_id: pci.to_string(),
                ordinal: ordinal.parse().ok()?,
                hw_queues: queues.parse().ok()?,
            }),
            _ => None,
        }
    }

    /// Ranks sharing a GPU need every hardware queue ([`check_shared_queues`]).
    fn check(records: &[Record<CudaExt>], sharers: &[usize]) -> Result<()> {
        check_shared_queues(
            sharers,
            &records.iter().map(|r| r.extra.hw_queues).collect::<Vec<_>>(),
            crate::knobs::HW_QUEUES,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::rendezvous::{check_records, LocalRecord};
    use symm_core::Error;

    fn info(r: usize) -> Record<CudaExt> {
        let local = LocalRecord {
            buffer_size: 1 << 20,
            total: 4 << 20,
            device: format!("GPU-{r:032x}"),
            extra: CudaExt {
                pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + r),
                ordinal: r,
                hw_queues: 8,
            },
        };
        Record::of_this_process(2, local, r as u64 + 1, false)
    }

    #[test]
    fn records_round_trip() {
        let i = info(1);
        assert_eq!(Record::<CudaExt>::decode("cuda", 1, &i.encode("cuda")).unwrap(), i);
        assert!(Record::<CudaExt>::decode("cuda", 0, b"symm-host-rdzv-1\n2").is_err());
        assert!(Record::<CudaExt>::decode("cuda", 0, &i.encode("symm-testkit-host")).is_err());
        assert_eq!(CudaExt::parse(&["0000:18:00.0", "x", "8"]), None);
        assert_eq!(CudaExt::parse(&["0000:18:00.0", "1"]), None);
    }

    /// The common checks are symm_core::rendezvous's (tested there); CUDA's adds the
    /// hardware queues of ranks that share a GPU.
    #[test]
    fn shared_gpus_need_every_queue() {
        let mut v: Vec<_> = (0..2).map(info).collect();
        CudaExt::check(&v, &[1, 1]).unwrap();
        match CudaExt::check(&v, &[2, 2]) {
            Err(Error::Unavailable(m)) => assert!(m.contains("CUDA_DEVICE_MAX_CONNECTIONS=32"), "{m}"),
            other => panic!("8 hardware queues on a shared GPU: {other:?}"),
        }
        v.iter_mut().for_each(|i| i.extra.hw_queues = 32);
        CudaExt::check(&v, &[2, 2]).unwrap();
        // Through every check: two rank threads sharing a GPU, allowed, with every queue.
        v[1].device = v[0].device.clone();
        v.iter_mut().for_each(|i| i.shared_ok = true);
        assert_eq!(check_records(2, &v, true).unwrap(), vec![2, 2]);
    }
}
