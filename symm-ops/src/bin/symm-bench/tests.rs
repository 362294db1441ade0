use super::*;

/// The command lines of the repository: what `cargo xtask bench` and CI's `bench --quick` pass
/// (xtask/src/bench.rs: the arguments, then `--json DIR/bench.json`), what `run.sh bench` passes
/// (the same, `--json $OUT/bench.json` last), and those of docs/benchmarks.md and
/// symm-ops/bench-notes.md.
const REPO_COMMAND_LINES: &[&str] = &[
    // xtask bench (CI: `bench --quick`), run.sh bench
    "--quick --json target/bench/bench.json",
    "--json target/bench/bench.json",
    "--full --json target/bench/bench.json",
    "--probe --no-setup --json target/bench/bench.json",
    "--probe-bw --no-setup --sizes 8M,128M --json target/bench/bench.json",
    "--modes graph,eager --rounds 7 --json results/bench.json",
    // docs/benchmarks.md
    "--modes graph,eager --rounds 7",
    "--modes graph,eager --rounds 5",
    "--probe-bw --no-setup --no-nccl --sizes 1M,4M,8M,32M,128M,512M --rounds 5 --iters 10",
    "--probe --no-setup --no-nccl --rounds 7",
    "--ops all_reduce,reduce_scatter,all_gather --algos lamport,auto --sizes 1K,16K,256K,1M,4M --modes graph,eager \
     --rounds 7 --no-setup --no-nccl",
    "--modes graph,eager --rounds 7 --no-setup --sizes 1K,4K,16K,64K,256K,1M,4M,16M",
    "--ops ar_rms_norm --modes graph,eager --rounds 7 --no-setup",
    "--ops ar_rms_norm --modes graph --rounds 7 --no-setup",
    "--skew-us 300 --ops all_reduce --algos lamport,nccl --sizes 1M,4M",
    // symm-ops/bench-notes.md
    "--ops all_reduce --modes graph --algos lamport,one_shot,one_shot:chunks_per_block=1,one_shot:chunks_per_block=8,\
     one_shot:minchunk=8K,one_shot:threads=256,two_shot,copy_engine,copy_engine:ce_fraction=0,\
     copy_engine:ce_fraction=1,copy_engine:ce_fraction=0.3,nccl,auto",
    "--ops reduce_scatter,all_gather --modes graph",
    "--modes graph,eager --rounds 9",
    "--modes graph,eager --rounds 7 --no-setup --ops all_reduce --sizes 4M,16M,64M,256M \
     --algos auto,nccl,copy_engine,copy_engine:ce_fraction=0,copy_engine:ce_fraction=0.25,one_shot",
    "--lamport-bytes 16M --ops all_reduce --sizes 1M,4M,16M",
    "--ops ar_rms_norm --ranks 1",
    "--ops ar_rms_norm --ranks 1 --no-setup",
    // symm-bench's own doc comment and --help
    "--ops all_reduce,reduce_scatter,all_gather --sizes 1K,16K,1M --dtype f16 --redop avg --iters 20 --rounds 3 \
     --modes eager --algos one_shot:chunk=64K:minchunk=8K:chunks_per_block=2:blocks=64:threads=256,\
     copy_engine:ce_fraction=0.5:ce_chunk=8M,copy_engine_staged --ranks 2 --staging 4M --hidden 4096 --tokens 1,8 \
     --no-nccl --no-setup",
];

#[test]
fn every_command_line_of_the_repo_parses() {
    for line in REPO_COMMAND_LINES {
        let argv: Vec<String> = line.split_whitespace().map(String::from).collect();
        if let Err(e) = parse_args(&argv) {
            panic!("{line}: {e}");
        }
    }
    let a = parse_args(&argv(&["--quick", "--json", "target/bench/bench.json"])).unwrap();
    assert_eq!(a.json, Some(PathBuf::from("target/bench/bench.json")));
    assert_eq!(
        (a.sizes.as_slice(), a.iters, a.rounds),
        (&[KIB, 16 * KIB, 64 * KIB][..], Some(10), 5)
    );
    assert!(a.quick && !a.default_sweep && a.nccl && a.setup && a.algos.is_none());
    assert_eq!(a.ops, Op::ALL);
    assert_eq!(a.modes, [Mode::Eager, Mode::Graph]);
    let a = parse_args(&argv(&[
        "--probe-bw",
        "--no-setup",
        "--no-nccl",
        "--sizes",
        "1M,4M,512M",
        "--rounds",
        "5",
        "--iters",
        "10",
    ]))
    .unwrap();
    assert!(a.probe_bw && !a.probe && !a.setup && !a.nccl);
    assert_eq!(
        (a.sizes, a.rounds, a.iters),
        (vec![MIB, 4 * MIB, 512 * MIB], 5, Some(10))
    );
    let a = parse_args(&argv(&["--ops", "ar_rms_norm", "--modes", "graph", "--ranks", "1"])).unwrap();
    assert!(a.epilogue && a.ops.is_empty());
    assert_eq!((a.modes, a.ranks), (vec![Mode::Graph], Some(1)));
    assert_eq!((a.hiddens, a.tokens), (vec![4096, 8192], vec![1, 8, 32, 128, 512]));
    let a = parse_args(&argv(&[
        "--ops",
        "all_reduce,ar_rms_norm",
        "--dtype",
        "fp32",
        "--redop",
        "max",
        "--staging",
        "4M",
        "--lamport-bytes",
        "16M",
        "--skew-us",
        "300",
        "--hidden",
        "512",
        "--tokens",
        "2,4",
    ]))
    .unwrap();
    assert!(a.epilogue);
    assert_eq!(a.ops, [Op::AllReduce]);
    assert_eq!((a.dtype, a.redop), (DType::F32, ReduceOp::Max));
    assert_eq!((a.staging, a.lamport_bytes, a.skew_us), (4 * MIB, Some(16 * MIB), 300));
    assert_eq!((a.hiddens, a.tokens), (vec![512], vec![2, 4]));
    let a = parse_args(&argv(&["--algos", "copy_engine:ce_fraction=0.5:ce_chunk=8M,two_shot"])).unwrap();
    let specs = a.algos_for(Op::AllReduce);
    assert_eq!(specs.len(), 2);
    assert_eq!(specs[0].label, "copy_engine:ce_fraction=0.5:ce_chunk=8M");
    assert_eq!(specs[0].base, "copy_engine");
    assert_eq!(
        specs[0].params,
        [
            ("ce_fraction".to_string(), "0.5".to_string()),
            ("ce_chunk".to_string(), "8M".to_string())
        ]
    );
    // The defaults, and the same command line given twice: the last value counts.
    let a = parse_args(&[]).unwrap();
    assert_eq!(
        (a.dtype, a.redop, a.rounds, a.iters, a.staging),
        (DType::BF16, ReduceOp::Sum, 15, None, 10 * MIB)
    );
    assert_eq!((a.ranks, a.lamport_bytes, a.json, a.skew_us), (None, None, None, 0));
    assert!(!a.quick && !a.full && a.default_sweep && !a.probe && !a.probe_bw && !a.epilogue);
    let a = parse_args(&argv(&[
        "--rounds", "3", "--rounds", "4", "--sizes", "1K", "--sizes", "2K", "--quick", "--quick",
    ]))
    .unwrap();
    assert_eq!((a.rounds, a.sizes), (4, vec![2 * KIB]));
    // The errors: an unknown algorithm or tuning key (the bench-notes' older `frac`), op, mode,
    // dtype, size or option, a missing value.
    for bad in [
        "--algos auto,copy_engine:frac=0.25",
        "--algos bogus",
        "--ops all_reduce,rendezvous",
        "--modes graph,exec",
        "--dtype f64",
        "--redop prod",
        "--sizes 1K,0",
        "--sizes 1X",
        "--hidden 0",
        "--rounds 0",
        "--iters 0",
        "--iters x",
        "--sizes",
        "--bogus",
        "extra",
    ] {
        let argv: Vec<String> = bad.split_whitespace().map(String::from).collect();
        assert!(parse_args(&argv).is_err(), "{bad} parsed");
    }
    let e = parse_args(&argv(&["--algos", "auto,copy_engine:frac=0.25"])).unwrap_err();
    assert!(
        e.contains("unknown algorithm parameter \"frac\"") && e.contains("ce_fraction"),
        "{e}"
    );
}

#[test]
fn help_lists_the_algorithms_and_tuning_keys() {
    let e = parse_args(&argv(&["--help"])).unwrap_err();
    for op in Op::ALL {
        assert!(e.contains(op.name()), "{e}");
        for a in op.default_algos().iter().chain(op.on_request()) {
            assert!(e.contains(a), "{e} misses {a}");
        }
    }
    for k in TUNING_KEYS {
        assert!(e.contains(k), "{e} misses {k}");
    }
    for flag in [
        "--quick",
        "--full",
        "--no-nccl",
        "--probe-bw",
        "--lamport-bytes",
        "--skew-us",
        "--json",
    ] {
        assert!(e.contains(flag), "{e} misses {flag}");
    }
}

#[test]
fn sizes_and_args() {
    let d = default_sizes();
    assert_eq!(d.first(), Some(&KIB));
    assert_eq!(d.last(), Some(&(256 * MIB)));
    for s in [4 * KIB, 16 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB] {
        assert!(d.contains(&s), "{s}");
    }
    assert_eq!(parse_size("16K"), Ok(16 * KIB));
    assert_eq!(parse_size("3"), Ok(3));
    assert!(parse_size("0").is_err() && parse_size("x").is_err());
    let a = parse_args(&["--quick".into(), "--algos".into(), "one_shot:chunk=64K,nccl,sm".into()]).unwrap();
    assert_eq!(a.sizes, vec![KIB, 16 * KIB, 64 * KIB]);
    assert_eq!(a.algos_for(Op::AllReduce).len(), 2);
    assert_eq!(a.algos_for(Op::AllGather).len(), 2);
    assert_eq!(a.algos_for(Op::ReduceScatter).len(), 1);
    let a = parse_args(&["--algos".into(), "lamport".into()]).unwrap();
    assert_eq!(
        Op::ALL.map(|o| a.algos_for(o).len()),
        [1, 1, 1],
        "lamport runs for every op"
    );
    assert!(parse_args(&["--algos".into(), "bogus".into()]).is_err());
    assert!(parse_args(&["--algos".into(), "one_shot:foo=1".into()]).is_err());
    let a = parse_args(&["--no-nccl".into()]).unwrap();
    assert!(a.algos_for(Op::AllReduce).iter().all(|s| s.base != "nccl"));
    assert_eq!(a.iters_for(KIB), 100);
    assert_eq!(a.iters_for(256 * MIB), 8);
}

#[test]
fn tuning_parameters_are_named_in_full() {
    let spec = "one_shot:chunk=64K:minchunk=8K:chunks_per_block=2:blocks=64:threads=256:ce_fraction=0.5:ce_chunk=8M";
    let a = AlgoSpec::parse(spec).unwrap();
    assert_eq!(
        a.params.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        TUNING_KEYS
    );
    // The old abbreviations are unknown keys, and the error names the valid ones.
    for old in ["cpb=2", "frac=0.5", "cechunk=8M"] {
        let e = AlgoSpec::parse(&format!("copy_engine:{old}")).unwrap_err();
        assert!(e.contains("unknown algorithm parameter"), "{e}");
        for k in TUNING_KEYS {
            assert!(e.contains(k), "{e} misses {k}");
        }
    }
}

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn host_default_sweep_stops_at_the_cap() {
    // The cap documented at host_default_cap: the largest default size in one 5 MiB
    // staging chunk of the host engine.
    assert_eq!(host_default_cap(), 4 * MIB);
    let a = parse_args(&[]).unwrap();
    // GPUs (which take args.sizes as parsed) keep the whole default sweep.
    assert_eq!(a.sizes, default_sizes());
    assert_eq!(a.sizes.last(), Some(&(256 * MIB)));
    let (sizes, note) = host_sweep(&a);
    assert_eq!(sizes, vec![KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB]);
    let note = note.expect("the capped sweep says where it stopped");
    assert_eq!(note.lines().count(), 1, "{note}");
    assert!(
        note.contains("stop at 4M") && note.contains("--full runs the whole sweep to 256M"),
        "{note}"
    );
    // --full: the whole sweep, as before.
    let full = parse_args(&argv(&["--full"])).unwrap();
    assert_eq!(host_sweep(&full), (default_sizes(), None));
    // --sizes and --quick: exactly those sizes, nothing said.
    let given = parse_args(&argv(&["--sizes", "1K,64M,512M"])).unwrap();
    assert_eq!(host_sweep(&given), (vec![KIB, 64 * MIB, 512 * MIB], None));
    let quick = parse_args(&argv(&["--quick"])).unwrap();
    assert_eq!(host_sweep(&quick), (vec![KIB, 16 * KIB, 64 * KIB], None));
    // --full with sizes chosen otherwise is a contradiction, said so.
    let e = parse_args(&argv(&["--full", "--sizes", "1K"])).unwrap_err();
    assert!(
        e.starts_with("--full runs the whole default sweep") && e.contains("--sizes"),
        "{e}"
    );
    let e = parse_args(&argv(&["--quick", "--full"])).unwrap_err();
    assert!(e.contains("--quick"), "{e}");
}

#[test]
fn progress_counts_down_and_estimates() {
    let args = parse_args(&[]).unwrap();
    let step = |op, size| args.step(op, size);
    let plan = vec![
        step(Op::AllReduce, KIB),
        step(Op::AllReduce, MIB),
        step(Op::AllGather, KIB),
        step(Op::AllGather, MIB),
    ];
    let (w1k, w1m) = (args.work(KIB), args.work(MIB));
    let secs = Duration::from_secs;
    let t0 = Instant::now();
    let mut p = Progress::new(plan.clone());
    assert_eq!(p.step(plan[0], t0, "a"), "[1/4] a: 4 left");
    // 2 s for all_reduce 1K: the rest scaled by bytes from it.
    let want = 2.0 / w1k * (w1m + w1k + w1m);
    assert_eq!(
        p.step(plan[1], t0 + secs(2), "b"),
        format!("[2/4] b: 3 left, ~{} (estimate)", fmt_secs(want))
    );
    // 10 s for all_reduce 1M: all_gather estimated from all_reduce at the same sizes.
    assert_eq!(p.step(plan[2], t0 + secs(12), "c"), "[3/4] c: 2 left, ~12 s (estimate)");
    // all_gather 1K took half all_reduce's time: its 1M is estimated at half too.
    assert_eq!(p.step(plan[3], t0 + secs(13), "d"), "[4/4] d: 1 left, ~5 s (estimate)");
    assert_eq!(p.summary(t0 + secs(18)).as_deref(), Some("[4/4] done in 18 s"));
    // No estimate from the first second; no summary when nothing ran.
    let mut p = Progress::new(plan.clone());
    p.step(plan[0], t0, "a");
    assert_eq!(p.step(plan[1], t0 + Duration::from_millis(500), "b"), "[2/4] b: 3 left");
    assert_eq!(Progress::new(plan).summary(t0), None);
    // A shorter line blanks out the longer one before it.
    assert_eq!(p.overwrite("abc"), "\rabc");
    assert_eq!(p.overwrite("x"), "\rx  ");
    for (s, want) in [
        (0.4, "0 s"),
        (59.4, "59 s"),
        (65.0, "1 min 05 s"),
        (3725.0, "1 h 02 min"),
        (f64::NAN, "0 s"),
    ] {
        assert_eq!(fmt_secs(s), want);
    }
}

#[test]
fn geometry_and_formulas() {
    let g = geometry(Op::AllGather, 4 * KIB, DType::BF16, 2);
    assert_eq!((g.count, g.in_elems, g.out_elems, g.bytes), (1024, 1024, 2048, 4096));
    let g = geometry(Op::ReduceScatter, 4 * KIB, DType::BF16, 2);
    assert_eq!((g.count, g.in_elems, g.out_elems), (1024, 2048, 1024));
    let r = Row {
        op: Op::AllReduce,
        bytes: 1_000_000,
        count: 0,
        dtype: DType::BF16,
        redop: ReduceOp::Sum,
        algo: "x".into(),
        path: String::new(),
        mode: Mode::Graph,
        time_us: 10.0,
        max_err: 0.0,
        ok: true,
        note: String::new(),
        world: 2,
    };
    assert!((r.algbw() - 100.0).abs() < 1e-9);
    assert!((r.busbw() - 100.0).abs() < 1e-9);
    assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
}

#[test]
fn values_are_exact_and_the_reference_checks() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let b = encode(dtype, 1000, |j| value(1, j));
        for j in 0..1000 {
            assert_eq!(decode_at(dtype, &b, j), value(1, j));
        }
    }
    // A correct all-gather output has zero error; a corrupted one does not.
    let g = geometry(Op::AllGather, 64, DType::F32, 2);
    let good = encode(DType::F32, g.out_elems, |i| value(i / g.count, i % g.count));
    assert_eq!(
        max_error(Op::AllGather, ReduceOp::Sum, DType::F32, &g, 0, 2, &good),
        0.0
    );
    let mut bad = good.clone();
    bad[0] ^= 0x40;
    bad[3] ^= 0x40;
    assert!(max_error(Op::AllGather, ReduceOp::Sum, DType::F32, &g, 0, 2, &bad) > 0.0);
    let g = geometry(Op::AllReduce, 64, DType::F32, 2);
    let sum = encode(DType::F32, g.out_elems, |i| value(0, i) + value(1, i));
    assert_eq!(max_error(Op::AllReduce, ReduceOp::Sum, DType::F32, &g, 0, 2, &sum), 0.0);
}

#[test]
fn json_document_has_the_keys_xtask_reads() {
    let args = parse_args(&argv(&["--quick"])).unwrap();
    let row = |algo: &str, time_us: f64| Row {
        op: Op::AllGather,
        bytes: 4 * KIB,
        count: 1024,
        dtype: DType::BF16,
        redop: ReduceOp::Sum,
        algo: algo.into(),
        path: "sm".into(),
        mode: Mode::Eager,
        time_us,
        max_err: 0.0,
        ok: time_us.is_finite(),
        note: "a\"b\\c\n".into(),
        world: 2,
    };
    let rows = [row("auto", 10.0), row("nccl", f64::NAN)];
    let setup = [SetupCost {
        what: "HostEngine::new".into(),
        bytes: MIB,
        median_ms: 1.5,
    }];
    let text = json::document("host (2 ranks)", 2, &args, &rows, &setup).unwrap();
    assert!(text.ends_with("}\n"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for (k, want) in [
        ("tool", "symm-bench"),
        ("backend", "host (2 ranks)"),
        ("dtype", "bf16"),
        ("redop", "sum"),
    ] {
        assert_eq!(v[k], want, "{k}");
    }
    assert_eq!((v["world"].as_u64(), v["rounds"].as_u64()), (Some(2), Some(5)));
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    let mut keys: Vec<&str> = results[0].as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want = [
        "op", "bytes", "count", "dtype", "redop", "algo", "path", "mode", "time_us", "algbw", "busbw", "max_err", "ok",
        "note",
    ];
    want.sort_unstable();
    assert_eq!(keys, want);
    let r = &results[0];
    assert_eq!(
        (r["op"].as_str(), r["algo"].as_str(), r["mode"].as_str()),
        (Some("all_gather"), Some("auto"), Some("eager"))
    );
    assert_eq!(
        (r["bytes"].as_u64(), r["count"].as_u64(), r["ok"].as_bool()),
        (Some(4096), Some(1024), Some(true))
    );
    assert_eq!(r["time_us"].as_f64(), Some(10.0));
    assert_eq!(r["busbw"].as_f64(), Some(rows[0].busbw()));
    // Escapes survive the round trip; a time that did not come out is null (its bandwidths 0).
    assert_eq!(r["note"], "a\"b\\c\n");
    assert!(results[1]["time_us"].is_null(), "{}", results[1]);
    assert_eq!(
        (results[1]["busbw"].as_f64(), results[1]["ok"].as_bool()),
        (Some(0.0), Some(false))
    );
    assert_eq!(
        v["setup"],
        serde_json::json!([{"what": "HostEngine::new", "size_bytes": MIB, "median_ms": 1.5}])
    );
}
