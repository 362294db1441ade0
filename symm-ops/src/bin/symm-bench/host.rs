use super::*;
use symm_ops::{AllGatherAlgo, AllReduceAlgo, CommConfig, Communicator};

pub fn run(mut args: Args) -> BoxResult<()> {
    if args.probe || args.probe_bw || args.epilogue || args.skew_us > 0 {
        return Err(
            "--probe, --probe-bw, --skew-us and --ops ar_rms_norm measure GPU kernels: no CUDA device here".into(),
        );
    }
    symm_testkit::link();
    let world = args.ranks.unwrap_or(2).max(1);
    let (sizes, note) = host_sweep(&args);
    args.sizes = sizes;
    if let Some(note) = note {
        println!("{note}");
    }
    let plan = args.plan(|op| args.algos_for(op).iter().filter(|a| host_algo(op, &a.base)).count());
    let store: Arc<dyn Store> = HashStore::new(T_STORE);
    let run_id = format!("symm-bench/host/{}", std::process::id());
    let shared = Arc::new(Shared::new(store, world, args.clone(), run_id, plan));
    let (rows, setup) = launch(shared, |rank, sh| match sh.args.dtype {
        DType::F32 => rank_body::<f32>(rank, sh),
        DType::F16 => rank_body::<half::f16>(rank, sh),
        _ => rank_body::<half::bf16>(rank, sh),
    })?;
    report("host backend (symm-testkit, CPU memory)", world, &args, &rows, &setup)
}

fn host_algo(op: Op, base: &str) -> bool {
    match op {
        Op::AllReduce => matches!(base, "auto" | "one_shot" | "two_shot"),
        Op::ReduceScatter => matches!(base, "auto" | "ring"),
        Op::AllGather => matches!(base, "auto" | "sm" | "ring"),
    }
}

fn rank_body<T: symm_ops::Element>(rank: usize, sh: &Shared) -> BoxResult<(Vec<Row>, Vec<SetupCost>)> {
    let args = &sh.args;
    let world = sh.world;
    let mut setup = Vec::new();
    let t0 = Instant::now();
    let group = Group::new(format!("{}-g", sh.run_id), rank, world, sh.store.clone())?;
    let comm = Communicator::new(&group, Device::host(rank as u32), CommConfig::default())?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if args.setup {
        let all = gather_f64s(sh, rank, "setup-comm", &[ms])?;
        setup.push(SetupCost {
            what: "host communicator creation (once)".into(),
            bytes: 0,
            median_ms: all.iter().filter_map(|v| v.first().copied()).fold(0.0, f64::max),
        });
    }
    let mut rows = Vec::new();
    for &op in &args.ops {
        for &size in &args.sizes {
            let g = geometry(op, size, args.dtype, world);
            let input: Vec<T> = (0..g.in_elems).map(|j| T::from_f32(value(rank, j) as f32)).collect();
            let mut out: Vec<T> = vec![T::default(); g.out_elems];
            for spec in args.algos_for(op).iter().filter(|a| host_algo(op, &a.base)) {
                sh.progress(
                    rank,
                    op,
                    size,
                    &format!("{} {} {}", op.name(), fmt_size(size), spec.label),
                );
                let run_op = |out: &mut Vec<T>| -> symm_ops::symm_core::Result<()> {
                    match (op, spec.base.as_str()) {
                        (Op::AllReduce, "one_shot") => {
                            comm.all_reduce_with(AllReduceAlgo::OneShot, Some((&input).into()), out.into(), args.redop)
                        }
                        (Op::AllReduce, "two_shot") => {
                            comm.all_reduce_with(AllReduceAlgo::TwoShot, Some((&input).into()), out.into(), args.redop)
                        }
                        (Op::AllReduce, _) => comm.all_reduce_out(&input, out, args.redop),
                        (Op::ReduceScatter, _) => comm.reduce_scatter_out(&input, out, args.redop),
                        (Op::AllGather, _) => comm.all_gather_out(&input, out),
                    }
                };
                let path = match op {
                    Op::AllReduce if spec.base == "auto" => comm.select_all_reduce(g.bytes).to_string(),
                    Op::AllGather if spec.base == "auto" => {
                        let a: AllGatherAlgo = comm.select_all_gather(g.bytes);
                        a.to_string()
                    }
                    _ => String::new(),
                };
                // Check first, on a poisoned output.
                out.iter_mut().for_each(|x| *x = T::from_f32(f32::NAN));
                let (err, ok, note) = match run_op(&mut out) {
                    Ok(()) => {
                        let bytes: Vec<u8> = out
                            .iter()
                            .flat_map(|x| {
                                let mut b = vec![0u8; args.dtype.size()];
                                x.write_le(&mut b);
                                b
                            })
                            .collect();
                        let e = max_error(op, args.redop, args.dtype, &g, rank, world, &bytes);
                        (e, e <= tolerance(args.dtype), String::new())
                    }
                    Err(e) => (f64::INFINITY, false, e.to_string()),
                };
                let iters = args.iters_for(g.bytes);
                let mut times = Vec::new();
                if ok {
                    for _ in 0..=args.rounds {
                        comm.barrier(None)?;
                        let t = Instant::now();
                        for _ in 0..iters {
                            run_op(&mut out)?;
                        }
                        times.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
                    }
                    times.remove(0);
                }
                let key = sh.next_key(rank, "host");
                rows.push(combine(
                    sh,
                    rank,
                    &key,
                    op,
                    &g,
                    &spec.label,
                    &path,
                    Mode::Eager,
                    median(&mut times),
                    err,
                    ok,
                    &note,
                )?);
            }
        }
    }
    Ok((rows, setup))
}
