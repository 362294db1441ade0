use std::time::Duration;

use super::*;
use crate::kernels;
use symm_core::coll::geometry::kernel_op;
use symm_core::coll::launch::{mode_op_index, mode_op_names};

#[test]
fn config_defaults() {
    let c = CollectivesConfig::new(DEFAULT_STAGING_BYTES, Duration::from_secs(10));
    assert_eq!(symm_core::coll::layout::lamport_bytes_for(2, c.lamport_bytes), 16 << 20);
    assert_eq!(
        symm_core::coll::layout::lamport_bytes_for(8, c.lamport_bytes),
        (16 << 20) / 7
    );
}

/// The kernel file compiles with NVRTC (when present; SYMM_REQUIRE_NVRTC=1 makes its absence
/// a failure) and holds every entry point the host side loads, with the protocol's
/// instructions and no trap / multicast.
#[test]
fn collectives_kernels_compile_with_nvrtc() {
    let src = kernels::source("collectives").unwrap();
    if let Err(e) = kernels::nvrtc_available() {
        assert!(!crate::knobs::require_nvrtc(), "SYMM_REQUIRE_NVRTC=1 but {e}");
        println!("SKIP collectives_kernels_compile_with_nvrtc: {e}");
        return;
    }
    let ptx = kernels::compile(src, "", "sm_90").unwrap_or_else(|e| panic!("collectives.cu: {e}"));
    for dt in ["f32", "f16", "bf16"] {
        for k in ["symm_lamport_", "symm_ring_", "symm_reduce_ptrs_"] {
            assert!(ptx.contains(&format!(".entry {k}{dt}(")), "{k}{dt} missing");
        }
    }
    for k in [
        "symm_coll_init",
        "symm_coll_barrier",
        "symm_coll_reject",
        "symm_coll_take_error",
    ] {
        assert!(ptx.contains(&format!(".entry {k}(")), "{k} missing");
    }
    // Every (mode, op) entry the host loads (COLL_MODE_OP_ENTRIES), in `mode_op_index` order:
    // each world's Lamport entries and the two-rank pull.
    let kinds: Vec<String> = (symm_core::coll::launch::LAMPORT_WORLD_MIN..=symm_core::coll::launch::LAMPORT_WORLD_MAX)
        .map(|w| format!("lamport{w}"))
        .chain(["pull2".to_string()])
        .collect();
    for kind in &kinds {
        for dt in ["f32", "f16", "bf16"] {
            let names = mode_op_names(kind, dt);
            assert_eq!(names.len(), 9);
            for n in &names {
                assert!(ptx.contains(&format!(".entry {n}(")), "{n} missing");
            }
            assert_eq!(
                names[mode_op_index(RingMode::AllReduce, 2)],
                format!("symm_{kind}_ar_max_{dt}")
            );
            assert_eq!(
                names[mode_op_index(RingMode::ReduceScatter, 1)],
                format!("symm_{kind}_rs_avg_{dt}")
            );
            assert_eq!(
                names[mode_op_index(RingMode::AllGather, 0)],
                format!("symm_{kind}_ag_{dt}")
            );
        }
    }
    for needle in [
        "ld.acquire.sys",
        "st.release.sys",
        "ld.volatile.global.v4",
        "%globaltimer",
        "cvt.rn.bf16x2.f32",
    ] {
        assert!(ptx.contains(needle), "{needle} missing from the PTX");
    }
    assert!(!ptx.contains("trap;"));
    assert!(!ptx.contains("multimem"));
    // The Lamport and ring kernels keep their vectors in registers (no local-memory stack).
    for k in [
        "symm_lamport_bf16",
        "symm_ring_bf16",
        "symm_lamport_add_rms_bf16",
        "symm_lamport2_add_rms_bf16",
        "symm_lamport4_add_rms_bf16",
        "symm_add_rms_bf16",
    ] {
        let start = ptx.find(&format!(".entry {k}(")).unwrap();
        let body = &ptx[start..];
        let end = body[1..].find(".entry").map_or(body.len(), |e| e + 1);
        assert!(!body[..end].contains("__local_depot"), "{k} spills to local memory");
    }
    // NOTE [pdl]: every entry `launch_coll` may launch with PDL waits for the kernel ahead
    // before its first memory access and then releases the next one (the fused entries' handoff
    // half excepted, NOTE [pdl] "handoff": its accesses come after the normal path's prologue
    // in the PTX and are not checked here).
    let mut checked = 0;
    for (name, body) in ptx_entries(&ptx) {
        if matches!(name, "symm_coll_init" | "symm_coll_take_error") {
            continue;
        }
        let wait = body
            .find("griddepcontrol.wait")
            .unwrap_or_else(|| panic!("{name}: no griddepcontrol.wait"));
        assert!(
            body.contains("griddepcontrol.launch_dependents"),
            "{name}: no griddepcontrol.launch_dependents"
        );
        // (The fused entries' handoff half reads before its own wait, NOTE [pdl] "handoff"; the
        // first wait of those entries is the normal path's prologue, before any access.)
        if let Some((at, ins)) = first_memory_access(body) {
            assert!(wait < at, "{name}: `{ins}` before griddepcontrol.wait");
        }
        checked += 1;
    }
    // 3 x (generic Lamport, ring, reduce_ptrs, generic pull) + 27 two-rank pull + 7 worlds x 27
    // Lamport (NOTE [lamport-world-entries]) + the barrier and the rejection + 3 x (fused
    // Lamport epilogue, separate epilogue) + 7 worlds x 3 fused world entries.
    assert_eq!(checked, 12 + 27 + 7 * 27 + 2 + 6 + 7 * 3);
    for dt in ["f32", "f16", "bf16"] {
        for k in ["symm_lamport_add_rms", "symm_lamport2_add_rms", "symm_add_rms"] {
            assert!(ptx.contains(&format!(".entry {k}_{dt}(")), "{k}_{dt} missing");
        }
    }
}

/// The `.entry` functions of a PTX text: (name, body up to the next entry).
fn ptx_entries(ptx: &str) -> Vec<(&str, &str)> {
    let starts: Vec<usize> = ptx.match_indices(".entry ").map(|(i, _)| i).collect();
    starts
        .iter()
        .enumerate()
        .map(|(k, &s)| {
            let body = &ptx[s..starts.get(k + 1).copied().unwrap_or(ptx.len())];
            let name = body[".entry ".len()..].split('(').next().unwrap_or("").trim();
            (name, body)
        })
        .collect()
}

/// Byte offset and text of the first instruction of `body` that touches memory other than
/// the kernel's parameters (loads, stores, atomics, reductions, async copies).
fn first_memory_access(body: &str) -> Option<(usize, &str)> {
    let mut off = 0;
    for line in body.split_inclusive('\n') {
        let t = line.trim_start();
        // Skip a guard predicate (`@%p1 ld.global...`).
        let ins = match t.strip_prefix('@') {
            Some(rest) => rest.split_once(char::is_whitespace).map_or("", |(_, i)| i.trim_start()),
            None => t,
        };
        let is_mem = ["ld.", "ldu.", "st.", "atom.", "red.", "cp."]
            .iter()
            .any(|p| ins.starts_with(p))
            && !ins.starts_with("ld.param");
        if is_mem {
            return Some((off, ins.trim_end()));
        }
        off += line.len();
    }
    None
}

/// The `COLL_ST_*` / `COLL_OPS_*` defines of the kernel file match layout.rs.
#[test]
fn kernel_defines_match_layout() {
    let src = kernels::source("collectives").unwrap().source;
    let defs = [
        ("COLL_ST_LAM_IDX", layout::ST_LAM_IDX),
        ("COLL_ST_LAM_ARRIVE", layout::ST_LAM_ARRIVE),
        ("COLL_ST_LAM_USED", layout::ST_LAM_USED),
        ("COLL_ST_RING_SEQ", layout::ST_RING_SEQ),
        ("COLL_ST_RING_ARRIVE", layout::ST_RING_ARRIVE),
        ("COLL_ST_PULL_DONE", layout::ST_PULL_DONE),
        ("COLL_ST_BAR_CNT", layout::ST_BAR_CNT),
        ("COLL_ST_EPI_ROWS", layout::ST_EPI_ROWS),
        ("COLL_EPI_SPLIT_MAX_ROWS", layout::EPI_SPLIT_MAX_ROWS),
        ("COLL_ST_EPI_TAG", layout::ST_EPI_TAG),
        ("COLL_ST_EPI_SLOTS", layout::ST_EPI_SLOTS),
        ("COLL_EPI_SLOTS_MAX", layout::EPI_SLOTS_MAX),
        ("COLL_OPS_BAR", layout::OPS_BAR),
        ("COLL_OPS_CHECK", layout::OPS_CHECK),
        ("COLL_OPS_PULL64", layout::OPS_PULL64),
        ("COLL_MAXW", layout::MAX_WORLD),
        ("COLL_MAX_THREADS", geometry::MAX_THREADS as usize),
        ("COLL_ST_MISMATCH", layout::ST_MISMATCH),
        ("COLL_MISMATCH_HEADER", layout::MISMATCH_HEADER as usize),
        ("COLL_MISMATCH_CHECK", layout::MISMATCH_CHECK as usize),
        ("COLL_MISMATCH_REJECTED", layout::MISMATCH_REJECTED as usize),
        ("COLL_MODE_AR", RingMode::AllReduce as usize),
        ("COLL_MODE_RS", RingMode::ReduceScatter as usize),
        ("COLL_MODE_AG", RingMode::AllGather as usize),
    ];
    for (name, value) in defs {
        let line = format!("#define {name} {value}");
        assert!(src.lines().any(|l| l.trim() == line), "kernel lacks `{line}`");
    }
    for (op, v) in ReduceOp::ALL.iter().zip(0u32..) {
        assert_eq!(kernel_op(*op), v);
    }
}

/// The argument lists against the PTX: CUDA's check of symm-core's `coll::args`.
mod argument_lists {
    use symm_core::coll::arg::{arg_bytes, KernelArg};
    use symm_core::coll::args::*;
    use symm_core::coll::geometry::{ring_plan, RingMode, Tuning};
    use symm_core::coll::layout::{WorkspaceLayout, MAX_WORLD};
    use symm_core::DType;

    use crate::kernels::ptx_param_sizes;

    /// A two-rank layout, rank 0's common arguments and a bound, for the argument tests.
    fn args_fixture() -> (WorkspaceLayout, Common, Bound) {
        let layout = WorkspaceLayout::new(2, 10 << 20, 4 << 20, 64).unwrap();
        let c = Common {
            bufs_dev: 1,
            pads_dev: 2,
            rank: 0,
            world: 2,
        };
        let bound = Bound {
            timeout_ns: 1,
            abort_host: 0,
        };
        (layout, c, bound)
    }

    #[test]
    fn ptx_params_parse() {
        let ptx = ".visible .entry k(\n\t.param .u64 k_param_0,\n\t.param .u32 k_param_1\n)\n{\n}";
        assert_eq!(ptx_param_sizes(ptx, "k"), Some(vec![8, 4]));
        assert_eq!(ptx_param_sizes(ptx, "nope"), None);
    }

    /// Every argument list (symm-core's `coll::args`, which every backend launches with) has the
    /// arity and sizes of its kernel's parameters in the PTX NVRTC produces (when NVRTC is present).
    #[test]
    fn argument_lists_match_the_kernels() {
        let (layout, c, bound) = args_fixture();
        let plan = ring_plan(
            RingMode::AllReduce,
            1000,
            1000,
            DType::BF16,
            &layout,
            &Tuning::default(),
            132,
        )
        .unwrap();
        let sizes = |a: &[KernelArg]| a.iter().map(arg_bytes).collect::<Vec<_>>();
        let mut cases: Vec<(String, Vec<usize>)> = vec![
            ("symm_coll_init".into(), sizes(&init(0, &layout))),
            ("symm_coll_barrier".into(), sizes(&barrier(&c, 3, &bound, 0))),
            ("symm_coll_take_error".into(), sizes(&take_error(0, 0))),
            ("symm_coll_reject".into(), sizes(&reject(&c))),
        ];
        for dt in ["f32", "f16", "bf16"] {
            cases.push((
                format!("symm_lamport_{dt}"),
                sizes(&lamport(
                    &c,
                    &Direct::default(),
                    &Lamport {
                        mode: RingMode::AllReduce,
                        op: 0,
                        input: 0,
                        output: 0,
                        count: 10,
                    },
                    &layout,
                    &bound,
                    &OpHeader::default(),
                )),
            ));
            cases.push((
                format!("symm_ring_{dt}"),
                sizes(&ring(
                    &c,
                    &Ring {
                        op: 0,
                        input: 0,
                        output: 0,
                        flags: 0,
                    },
                    &plan,
                    &layout,
                    &bound,
                    &OpHeader::default(),
                )),
            ));
            cases.push((
                format!("symm_pull_{dt}"),
                sizes(&pull(
                    &c,
                    &Direct::default(),
                    0,
                    &Pull {
                        mode: RingMode::AllGather,
                        op: 0,
                        out: 0,
                        n: 10,
                        srcs: [0; MAX_WORLD],
                        dsts: None,
                        check: 0,
                    },
                    &bound,
                )),
            ));
            cases.push((
                format!("symm_reduce_ptrs_{dt}"),
                sizes(&reduce_ptrs(0, 2, 0, 0, 10, &[1, 2])),
            ));
        }
        // The specialised Lamport (every world 2..=8) and pull (two ranks) entries take the
        // generic entries' arguments.
        let generic: Vec<(String, Vec<usize>)> = cases
            .iter()
            .filter(|(n, _)| n.starts_with("symm_lamport_") || n.starts_with("symm_pull_"))
            .cloned()
            .collect();
        for (name, sizes) in generic {
            let (kind, dt) = name.trim_start_matches("symm_").split_once('_').unwrap();
            let worlds: Vec<usize> = if kind == "lamport" {
                (symm_core::coll::launch::LAMPORT_WORLD_MIN..=symm_core::coll::launch::LAMPORT_WORLD_MAX).collect()
            } else {
                vec![2]
            };
            for w in worlds {
                for n in symm_core::coll::launch::mode_op_names(&format!("{kind}{w}"), dt) {
                    cases.push((n, sizes.clone()));
                }
                // The Lamport two-shot's entries (3..=8 ranks) too.
                if kind == "lamport" {
                    for n in symm_core::coll::launch::lamport_two_shot_names(w, dt) {
                        cases.push((n, sizes.clone()));
                    }
                }
            }
        }
        // Every list fits the launcher (checked without NVRTC too).
        for (name, got) in &cases {
            assert!(
                got.len() <= symm_core::coll::arg::MAX_ARGS,
                "{name}: {} arguments, the launcher takes at most {}",
                got.len(),
                symm_core::coll::arg::MAX_ARGS
            );
        }
        if let Err(e) = crate::kernels::nvrtc_available() {
            println!("SKIP argument_lists_match_the_kernels (the PTX half): {e}");
            return;
        }
        let src = crate::kernels::source("collectives").unwrap();
        let ptx = crate::kernels::compile(src, "", "sm_90").unwrap();
        for (name, got) in cases {
            let want = ptx_param_sizes(&ptx, &name).unwrap_or_else(|| panic!("{name} not in the PTX"));
            assert_eq!(got, want, "{name}: host arguments vs kernel parameters");
        }
    }
}
