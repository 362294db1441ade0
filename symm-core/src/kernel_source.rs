//! The kernel text every GPU backend compiles: the collectives (Lamport one-shot, ring,
//! reduction from pointers, fused pull, subset barrier, fused epilogues), the pad sync kernels
//! (barrier, put_signal, wait_signal) and the device helpers they share, kept once in
//! `symm-core/kernels/` so the vendors cannot drift (issue #22).
//!
//! Text only: symm-core compiles nothing. A backend compiles
//! `pad::c_defines() + its vendor header + COMMON + defines + expand_includes(COLLECTIVES)`:
//! symm-cuda with NVRTC (`symm-cuda/kernels/vendor.cuh`), symm-rocm with hiprtc
//! (`symm-rocm/kernels/vendor.hip.h`; its defines come right after the pad defines, so they can
//! set the vendor header's `#ifndef` defaults). The vendor header defines every primitive the shared text
//! uses (atomics and memory orders, the clock, PDL, lanes and shuffles, vector loads and stores,
//! half and bfloat16 conversions); the shared text holds no `asm` and no `#if` on the vendor.
//! [`COLLECTIVE_ENTRIES`] lists the `extern "C" __global__` entries of [`COLLECTIVES`]; each
//! backend's tests compare it with what its compiler built.

/// One embedded kernel text: a header the collectives include, or the collectives themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelText {
    /// File name in `symm-core/kernels` (`lamport.cuh`).
    pub file: &'static str,
    /// The file's text.
    pub text: &'static str,
}

/// `symm-core/kernels/common.cuh`: the device helpers of every kernel file (pad slots, errors,
/// bounded waits, NOTE [pdl]) and the hand copy of the pad `#define`s.
pub const COMMON: &str = include_str!("../kernels/common.cuh");

/// `symm-core/kernels/collectives.cu` (NOTE [collectives-protocols]), before
/// [`expand_includes`].
pub const COLLECTIVES: &str = include_str!("../kernels/collectives.cu");

/// `symm-core/kernels/sync.cu`: barrier, put_signal and wait_signal over the signal pads (NOTE
/// [signal-pad-layout]), the kernels behind every backend's `SymmetricMemory` sync calls.
pub const SYNC: &str = include_str!("../kernels/sync.cu");

/// The entries of [`SYNC`].
pub const SYNC_ENTRIES: &[&str] = &["symm_barrier", "symm_put_signal", "symm_wait_signal"];

/// A [`KernelText`] of `symm-core/kernels/<file>`.
macro_rules! kernel_text {
    ($file:literal) => {
        KernelText {
            file: $file,
            text: include_str!(concat!("../kernels/", $file)),
        }
    };
}

/// The headers `collectives.cu` includes, one per mechanism.
pub const HEADERS: &[KernelText] = &[
    kernel_text!("lamport.cuh"),
    kernel_text!("ring.cuh"),
    kernel_text!("reduce_ptrs.cuh"),
    kernel_text!("pull.cuh"),
    kernel_text!("epilogue.cuh"),
];

/// `text` (the file `file`) with every line `#include "name.cuh"` naming one of [`HEADERS`]
/// replaced by that header, between `#line` directives so compile errors name the right file and
/// line (one level: the headers include nothing). Neither NVRTC nor hiprtc is given an include
/// path, so the compiled text, and with it every disk-cache key, holds all of the source.
pub fn expand_includes(file: &str, text: &str) -> String {
    let mut out = String::with_capacity(text.len() + HEADERS.iter().map(|h| h.text.len() + 64).sum::<usize>());
    for (i, line) in text.lines().enumerate() {
        let header = line
            .trim()
            .strip_prefix("#include \"")
            .and_then(|rest| rest.strip_suffix('"'))
            .and_then(|name| HEADERS.iter().find(|h| h.file == name));
        match header {
            Some(h) => {
                out.push_str(&format!("#line 1 \"{}\"\n{}\n", h.file, h.text));
                out.push_str(&format!("#line {} \"{file}\"\n", i + 2));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Every `extern "C" __global__` entry of [`COLLECTIVES`], written once: symm-cuda's
/// tests compare it with the `.entry` names of NVRTC's PTX, symm-rocm's with the kernel
/// descriptors (`NAME.kd`) of hiprtc's code objects, so both vendors build the same list.
pub const COLLECTIVE_ENTRIES: &[&str] = &[
    // Fused epilogues (NOTE [fused-epilogue]): the separate epilogue kernel.
    "symm_add_rms_bf16",
    "symm_add_rms_f16",
    "symm_add_rms_f32",
    // Subset barrier, workspace init, rejection, error read-out.
    "symm_coll_barrier",
    "symm_coll_init",
    "symm_coll_reject",
    "symm_coll_take_error",
    // Lamport one-shot, generic.
    "symm_lamport_add_rms_bf16",
    "symm_lamport_add_rms_f16",
    "symm_lamport_add_rms_f32",
    "symm_lamport_bf16",
    "symm_lamport_f16",
    "symm_lamport_f32",
    // Lamport one-shot, the fused epilogue's entries for one world size 2..8.
    "symm_lamport2_add_rms_bf16",
    "symm_lamport2_add_rms_f16",
    "symm_lamport2_add_rms_f32",
    "symm_lamport3_add_rms_bf16",
    "symm_lamport3_add_rms_f16",
    "symm_lamport3_add_rms_f32",
    "symm_lamport4_add_rms_bf16",
    "symm_lamport4_add_rms_f16",
    "symm_lamport4_add_rms_f32",
    "symm_lamport5_add_rms_bf16",
    "symm_lamport5_add_rms_f16",
    "symm_lamport5_add_rms_f32",
    "symm_lamport6_add_rms_bf16",
    "symm_lamport6_add_rms_f16",
    "symm_lamport6_add_rms_f32",
    "symm_lamport7_add_rms_bf16",
    "symm_lamport7_add_rms_f16",
    "symm_lamport7_add_rms_f32",
    "symm_lamport8_add_rms_bf16",
    "symm_lamport8_add_rms_f16",
    "symm_lamport8_add_rms_f32",
    // Lamport one-shot, one world size 2..8 and (mode, op) per entry (NOTE [lamport-world-entries],
    // COLL_MODE_OP_ENTRIES).
    "symm_lamport2_ag_bf16",
    "symm_lamport2_ag_f16",
    "symm_lamport2_ag_f32",
    "symm_lamport2_ar_avg_bf16",
    "symm_lamport2_ar_avg_f16",
    "symm_lamport2_ar_avg_f32",
    "symm_lamport2_ar_max_bf16",
    "symm_lamport2_ar_max_f16",
    "symm_lamport2_ar_max_f32",
    "symm_lamport2_ar_min_bf16",
    "symm_lamport2_ar_min_f16",
    "symm_lamport2_ar_min_f32",
    "symm_lamport2_ar_sum_bf16",
    "symm_lamport2_ar_sum_f16",
    "symm_lamport2_ar_sum_f32",
    "symm_lamport2_rs_avg_bf16",
    "symm_lamport2_rs_avg_f16",
    "symm_lamport2_rs_avg_f32",
    "symm_lamport2_rs_max_bf16",
    "symm_lamport2_rs_max_f16",
    "symm_lamport2_rs_max_f32",
    "symm_lamport2_rs_min_bf16",
    "symm_lamport2_rs_min_f16",
    "symm_lamport2_rs_min_f32",
    "symm_lamport2_rs_sum_bf16",
    "symm_lamport2_rs_sum_f16",
    "symm_lamport2_rs_sum_f32",
    "symm_lamport3_ag_bf16",
    "symm_lamport3_ag_f16",
    "symm_lamport3_ag_f32",
    "symm_lamport3_ar_avg_bf16",
    "symm_lamport3_ar_avg_f16",
    "symm_lamport3_ar_avg_f32",
    "symm_lamport3_ar_max_bf16",
    "symm_lamport3_ar_max_f16",
    "symm_lamport3_ar_max_f32",
    "symm_lamport3_ar_min_bf16",
    "symm_lamport3_ar_min_f16",
    "symm_lamport3_ar_min_f32",
    "symm_lamport3_ar_sum_bf16",
    "symm_lamport3_ar_sum_f16",
    "symm_lamport3_ar_sum_f32",
    "symm_lamport3_rs_avg_bf16",
    "symm_lamport3_rs_avg_f16",
    "symm_lamport3_rs_avg_f32",
    "symm_lamport3_rs_max_bf16",
    "symm_lamport3_rs_max_f16",
    "symm_lamport3_rs_max_f32",
    "symm_lamport3_rs_min_bf16",
    "symm_lamport3_rs_min_f16",
    "symm_lamport3_rs_min_f32",
    "symm_lamport3_rs_sum_bf16",
    "symm_lamport3_rs_sum_f16",
    "symm_lamport3_rs_sum_f32",
    "symm_lamport4_ag_bf16",
    "symm_lamport4_ag_f16",
    "symm_lamport4_ag_f32",
    "symm_lamport4_ar_avg_bf16",
    "symm_lamport4_ar_avg_f16",
    "symm_lamport4_ar_avg_f32",
    "symm_lamport4_ar_max_bf16",
    "symm_lamport4_ar_max_f16",
    "symm_lamport4_ar_max_f32",
    "symm_lamport4_ar_min_bf16",
    "symm_lamport4_ar_min_f16",
    "symm_lamport4_ar_min_f32",
    "symm_lamport4_ar_sum_bf16",
    "symm_lamport4_ar_sum_f16",
    "symm_lamport4_ar_sum_f32",
    "symm_lamport4_rs_avg_bf16",
    "symm_lamport4_rs_avg_f16",
    "symm_lamport4_rs_avg_f32",
    "symm_lamport4_rs_max_bf16",
    "symm_lamport4_rs_max_f16",
    "symm_lamport4_rs_max_f32",
    "symm_lamport4_rs_min_bf16",
    "symm_lamport4_rs_min_f16",
    "symm_lamport4_rs_min_f32",
    "symm_lamport4_rs_sum_bf16",
    "symm_lamport4_rs_sum_f16",
    "symm_lamport4_rs_sum_f32",
    "symm_lamport5_ag_bf16",
    "symm_lamport5_ag_f16",
    "symm_lamport5_ag_f32",
    "symm_lamport5_ar_avg_bf16",
    "symm_lamport5_ar_avg_f16",
    "symm_lamport5_ar_avg_f32",
    "symm_lamport5_ar_max_bf16",
    "symm_lamport5_ar_max_f16",
    "symm_lamport5_ar_max_f32",
    "symm_lamport5_ar_min_bf16",
    "symm_lamport5_ar_min_f16",
    "symm_lamport5_ar_min_f32",
    "symm_lamport5_ar_sum_bf16",
    "symm_lamport5_ar_sum_f16",
    "symm_lamport5_ar_sum_f32",
    "symm_lamport5_rs_avg_bf16",
    "symm_lamport5_rs_avg_f16",
    "symm_lamport5_rs_avg_f32",
    "symm_lamport5_rs_max_bf16",
    "symm_lamport5_rs_max_f16",
    "symm_lamport5_rs_max_f32",
    "symm_lamport5_rs_min_bf16",
    "symm_lamport5_rs_min_f16",
    "symm_lamport5_rs_min_f32",
    "symm_lamport5_rs_sum_bf16",
    "symm_lamport5_rs_sum_f16",
    "symm_lamport5_rs_sum_f32",
    "symm_lamport6_ag_bf16",
    "symm_lamport6_ag_f16",
    "symm_lamport6_ag_f32",
    "symm_lamport6_ar_avg_bf16",
    "symm_lamport6_ar_avg_f16",
    "symm_lamport6_ar_avg_f32",
    "symm_lamport6_ar_max_bf16",
    "symm_lamport6_ar_max_f16",
    "symm_lamport6_ar_max_f32",
    "symm_lamport6_ar_min_bf16",
    "symm_lamport6_ar_min_f16",
    "symm_lamport6_ar_min_f32",
    "symm_lamport6_ar_sum_bf16",
    "symm_lamport6_ar_sum_f16",
    "symm_lamport6_ar_sum_f32",
    "symm_lamport6_rs_avg_bf16",
    "symm_lamport6_rs_avg_f16",
    "symm_lamport6_rs_avg_f32",
    "symm_lamport6_rs_max_bf16",
    "symm_lamport6_rs_max_f16",
    "symm_lamport6_rs_max_f32",
    "symm_lamport6_rs_min_bf16",
    "symm_lamport6_rs_min_f16",
    "symm_lamport6_rs_min_f32",
    "symm_lamport6_rs_sum_bf16",
    "symm_lamport6_rs_sum_f16",
    "symm_lamport6_rs_sum_f32",
    "symm_lamport7_ag_bf16",
    "symm_lamport7_ag_f16",
    "symm_lamport7_ag_f32",
    "symm_lamport7_ar_avg_bf16",
    "symm_lamport7_ar_avg_f16",
    "symm_lamport7_ar_avg_f32",
    "symm_lamport7_ar_max_bf16",
    "symm_lamport7_ar_max_f16",
    "symm_lamport7_ar_max_f32",
    "symm_lamport7_ar_min_bf16",
    "symm_lamport7_ar_min_f16",
    "symm_lamport7_ar_min_f32",
    "symm_lamport7_ar_sum_bf16",
    "symm_lamport7_ar_sum_f16",
    "symm_lamport7_ar_sum_f32",
    "symm_lamport7_rs_avg_bf16",
    "symm_lamport7_rs_avg_f16",
    "symm_lamport7_rs_avg_f32",
    "symm_lamport7_rs_max_bf16",
    "symm_lamport7_rs_max_f16",
    "symm_lamport7_rs_max_f32",
    "symm_lamport7_rs_min_bf16",
    "symm_lamport7_rs_min_f16",
    "symm_lamport7_rs_min_f32",
    "symm_lamport7_rs_sum_bf16",
    "symm_lamport7_rs_sum_f16",
    "symm_lamport7_rs_sum_f32",
    "symm_lamport8_ag_bf16",
    "symm_lamport8_ag_f16",
    "symm_lamport8_ag_f32",
    "symm_lamport8_ar_avg_bf16",
    "symm_lamport8_ar_avg_f16",
    "symm_lamport8_ar_avg_f32",
    "symm_lamport8_ar_max_bf16",
    "symm_lamport8_ar_max_f16",
    "symm_lamport8_ar_max_f32",
    "symm_lamport8_ar_min_bf16",
    "symm_lamport8_ar_min_f16",
    "symm_lamport8_ar_min_f32",
    "symm_lamport8_ar_sum_bf16",
    "symm_lamport8_ar_sum_f16",
    "symm_lamport8_ar_sum_f32",
    "symm_lamport8_rs_avg_bf16",
    "symm_lamport8_rs_avg_f16",
    "symm_lamport8_rs_avg_f32",
    "symm_lamport8_rs_max_bf16",
    "symm_lamport8_rs_max_f16",
    "symm_lamport8_rs_max_f32",
    "symm_lamport8_rs_min_bf16",
    "symm_lamport8_rs_min_f16",
    "symm_lamport8_rs_min_f32",
    "symm_lamport8_rs_sum_bf16",
    "symm_lamport8_rs_sum_f16",
    "symm_lamport8_rs_sum_f32",
    // Lamport two-shot all-reduce, one world size 3..8 and op per entry (NOTE [lamport-two-shot]).
    "symm_lamport3_ar2_avg_bf16",
    "symm_lamport3_ar2_avg_f16",
    "symm_lamport3_ar2_avg_f32",
    "symm_lamport3_ar2_max_bf16",
    "symm_lamport3_ar2_max_f16",
    "symm_lamport3_ar2_max_f32",
    "symm_lamport3_ar2_min_bf16",
    "symm_lamport3_ar2_min_f16",
    "symm_lamport3_ar2_min_f32",
    "symm_lamport3_ar2_sum_bf16",
    "symm_lamport3_ar2_sum_f16",
    "symm_lamport3_ar2_sum_f32",
    "symm_lamport4_ar2_avg_bf16",
    "symm_lamport4_ar2_avg_f16",
    "symm_lamport4_ar2_avg_f32",
    "symm_lamport4_ar2_max_bf16",
    "symm_lamport4_ar2_max_f16",
    "symm_lamport4_ar2_max_f32",
    "symm_lamport4_ar2_min_bf16",
    "symm_lamport4_ar2_min_f16",
    "symm_lamport4_ar2_min_f32",
    "symm_lamport4_ar2_sum_bf16",
    "symm_lamport4_ar2_sum_f16",
    "symm_lamport4_ar2_sum_f32",
    "symm_lamport5_ar2_avg_bf16",
    "symm_lamport5_ar2_avg_f16",
    "symm_lamport5_ar2_avg_f32",
    "symm_lamport5_ar2_max_bf16",
    "symm_lamport5_ar2_max_f16",
    "symm_lamport5_ar2_max_f32",
    "symm_lamport5_ar2_min_bf16",
    "symm_lamport5_ar2_min_f16",
    "symm_lamport5_ar2_min_f32",
    "symm_lamport5_ar2_sum_bf16",
    "symm_lamport5_ar2_sum_f16",
    "symm_lamport5_ar2_sum_f32",
    "symm_lamport6_ar2_avg_bf16",
    "symm_lamport6_ar2_avg_f16",
    "symm_lamport6_ar2_avg_f32",
    "symm_lamport6_ar2_max_bf16",
    "symm_lamport6_ar2_max_f16",
    "symm_lamport6_ar2_max_f32",
    "symm_lamport6_ar2_min_bf16",
    "symm_lamport6_ar2_min_f16",
    "symm_lamport6_ar2_min_f32",
    "symm_lamport6_ar2_sum_bf16",
    "symm_lamport6_ar2_sum_f16",
    "symm_lamport6_ar2_sum_f32",
    "symm_lamport7_ar2_avg_bf16",
    "symm_lamport7_ar2_avg_f16",
    "symm_lamport7_ar2_avg_f32",
    "symm_lamport7_ar2_max_bf16",
    "symm_lamport7_ar2_max_f16",
    "symm_lamport7_ar2_max_f32",
    "symm_lamport7_ar2_min_bf16",
    "symm_lamport7_ar2_min_f16",
    "symm_lamport7_ar2_min_f32",
    "symm_lamport7_ar2_sum_bf16",
    "symm_lamport7_ar2_sum_f16",
    "symm_lamport7_ar2_sum_f32",
    "symm_lamport8_ar2_avg_bf16",
    "symm_lamport8_ar2_avg_f16",
    "symm_lamport8_ar2_avg_f32",
    "symm_lamport8_ar2_max_bf16",
    "symm_lamport8_ar2_max_f16",
    "symm_lamport8_ar2_max_f32",
    "symm_lamport8_ar2_min_bf16",
    "symm_lamport8_ar2_min_f16",
    "symm_lamport8_ar2_min_f32",
    "symm_lamport8_ar2_sum_bf16",
    "symm_lamport8_ar2_sum_f16",
    "symm_lamport8_ar2_sum_f32",
    // Fused zero-copy pull, generic.
    "symm_pull_bf16",
    "symm_pull_f16",
    "symm_pull_f32",
    // Fused zero-copy pull, two ranks.
    "symm_pull2_ag_bf16",
    "symm_pull2_ag_f16",
    "symm_pull2_ag_f32",
    "symm_pull2_ar_avg_bf16",
    "symm_pull2_ar_avg_f16",
    "symm_pull2_ar_avg_f32",
    "symm_pull2_ar_max_bf16",
    "symm_pull2_ar_max_f16",
    "symm_pull2_ar_max_f32",
    "symm_pull2_ar_min_bf16",
    "symm_pull2_ar_min_f16",
    "symm_pull2_ar_min_f32",
    "symm_pull2_ar_sum_bf16",
    "symm_pull2_ar_sum_f16",
    "symm_pull2_ar_sum_f32",
    "symm_pull2_rs_avg_bf16",
    "symm_pull2_rs_avg_f16",
    "symm_pull2_rs_avg_f32",
    "symm_pull2_rs_max_bf16",
    "symm_pull2_rs_max_f16",
    "symm_pull2_rs_max_f32",
    "symm_pull2_rs_min_bf16",
    "symm_pull2_rs_min_f16",
    "symm_pull2_rs_min_f32",
    "symm_pull2_rs_sum_bf16",
    "symm_pull2_rs_sum_f16",
    "symm_pull2_rs_sum_f32",
    // Reduction from pointers (copy-engine all-reduce).
    "symm_reduce_ptrs_bf16",
    "symm_reduce_ptrs_f16",
    "symm_reduce_ptrs_f32",
    // Chunked ring.
    "symm_ring_bf16",
    "symm_ring_f16",
    "symm_ring_f32",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_unique_and_counted() {
        let unique: std::collections::BTreeSet<&str> = COLLECTIVE_ENTRIES.iter().copied().collect();
        assert_eq!(unique.len(), COLLECTIVE_ENTRIES.len(), "an entry is listed twice");
        // 3 dtypes x (generic Lamport, ring, reduce_ptrs, pull) + 27 two-rank pull entries + 7
        // worlds x 27 Lamport entries (NOTE [lamport-world-entries]) + the barrier, init,
        // rejection and error entries + 3 x (separate epilogue, generic fused epilogue) + 7 worlds
        // x 3 fused epilogue entries + 6 worlds (3..8) x 12 Lamport two-shot entries (NOTE
        // [lamport-two-shot]).
        assert_eq!(COLLECTIVE_ENTRIES.len(), 12 + 27 + 7 * 27 + 4 + 6 + 7 * 3 + 6 * 12);
        for e in COLLECTIVE_ENTRIES {
            assert!(e.starts_with("symm_"), "{e}");
        }
    }

    #[test]
    fn includes_are_expanded_once_with_line_directives() {
        let full = expand_includes("collectives.cu", COLLECTIVES);
        assert!(
            !full.lines().any(|l| l.trim_start().starts_with("#include")),
            "an include was left"
        );
        for h in HEADERS {
            assert!(
                COLLECTIVES.contains(&format!("#include \"{}\"", h.file)),
                "{} is not included",
                h.file
            );
            assert_eq!(full.matches(h.text).count(), 1, "{}", h.file);
            assert!(full.contains(&format!("#line 1 \"{}\"\n", h.file)));
        }
        // Unknown includes stay as they are (a compile error names them).
        assert_eq!(
            expand_includes("x.cu", "#include \"nope.cuh\"\n"),
            "#include \"nope.cuh\"\n"
        );
    }

    /// The shared text is vendor-neutral: no inline assembly, no vendor `#if`, no trap, no
    /// multicast; NOTE anchors the Rust side cites are here.
    #[test]
    fn shared_text_is_vendor_neutral() {
        let code = |text: &str| -> String {
            text.lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let all = std::iter::once(("common.cuh", COMMON))
            .chain(std::iter::once(("collectives.cu", COLLECTIVES)))
            .chain(HEADERS.iter().map(|h| (h.file, h.text)));
        for (name, text) in all {
            let c = code(text);
            for banned in [
                "asm(",
                "asm volatile",
                "__CUDA_ARCH__",
                "__HIP",
                "__shfl",
                "__activemask",
                "__trap",
                "trap;",
                "multimem",
                "nvls",
            ] {
                assert!(!c.contains(banned), "{name} uses {banned}");
            }
        }
        for note in [
            "NOTE [collectives-protocols]",
            "NOTE [error-mirror]",
            "NOTE [host-abort-poll]",
        ] {
            assert!(COLLECTIVES.contains(note), "{note}");
        }
        assert!(COMMON.contains("NOTE [pdl]"));
        assert!(HEADERS.iter().any(|h| h.text.contains("NOTE [fused-epilogue]")));
    }
}
