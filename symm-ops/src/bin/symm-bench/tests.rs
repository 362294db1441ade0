use super::*;

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
fn json_escapes() {
    assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
    assert_eq!(json_num(f64::NAN), "null");
}
