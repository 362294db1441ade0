//! `--probe` and `--probe-bw`: symm-cuda's latency probes (every probe kernel, eager and in a
//! CUDA graph, plainly and with programmatic dependent launch) and bandwidth probes (SM copy
//! kernel and copy engine, reading from or writing to the next rank's memory), timed with
//! `gpu`'s rig (`RankState`, `time_rounds`). (The bandwidth probe's copies take raw device
//! addresses of its own probe buffer: its `unsafe` blocks say why each is sound.)
#![allow(unsafe_code)]

use std::fmt::Write;
use std::time::Duration;

use symm_ops::symm_core::{get_allocator, DeviceType};
use symm_ops::symm_cuda::driver::mem::unchecked::memset_d32_async;

use crate::gpu::{time_rounds, RankState};
use crate::{fmt_size, gather_f64s, median, BoxResult, Device, Group, Mode, Shared, MIB, T_STORE};

/// `--probe`: every latency probe (symm_cuda::probe) in eager mode and CUDA-graph replay, median
/// us per launch of the slowest rank; rank 0 prints the table. The probes' counters are
/// checked afterwards (a wait that timed out leaves its counter short).
pub(crate) fn probes(sh: &Shared, st: &RankState) -> BoxResult<()> {
    use symm_ops::symm_cuda::probe::{LatencyProbe, Probe};
    let args = &sh.args;
    let g = Group::new(format!("{}-probe", sh.run_id), st.rank, st.world, sh.store.clone())?;
    let a = get_allocator(DeviceType::Cuda)?.alloc(LatencyProbe::BYTES, Device::cuda(st.rank as u32), &g)?;
    let m = a.rendezvous(T_STORE)?;
    let p = LatencyProbe::new(&st.ctx, &st.stream, m, Duration::from_secs(10))?;
    let iters = args.iters.unwrap_or(200);
    let s = &st.stream;
    let mut expected = [0u32; 7];
    let mut table = String::new();
    // Every probe launched plainly, then (compute capability 9.0+) with programmatic
    // dependent launch (NOTE [pdl]): the launch latency PDL hides between back-to-back kernels.
    let pdl_ok = symm_ops::symm_cuda::driver::supports_pdl(st.ctx.cu_device())?;
    let hows: &[bool] = if pdl_ok { &[false, true] } else { &[false] };
    for &pdl in hows {
        let how = symm_ops::symm_cuda::driver::launch::Launch { pdl, cluster: 0 };
        for (i, probe) in Probe::ALL.into_iter().enumerate() {
            let mut cols = Vec::new();
            for &mode in &args.modes {
                // One warm-up launch, then the rounds (each counted in the probe's counter).
                p.launch_with(s, probe, how)?;
                expected[i] += 1;
                let mut times = time_rounds(st, mode, iters, args.rounds, &mut |_| Ok(p.launch_with(s, probe, how)?))?;
                expected[i] += ((args.rounds + 1) * iters) as u32;
                s.synchronize()?;
                let mine = median(&mut times);
                let key = sh.next_key(st.rank, &format!("probe-{i}-{pdl}-{}", mode.name()));
                let all = gather_f64s(sh, st.rank, &key, &[mine])?;
                cols.push(all.iter().filter_map(|v| v.first().copied()).fold(0.0, f64::max));
            }
            let name = format!("{}{}", probe.name(), if pdl { ", PDL" } else { "" });
            let _ = write!(table, "{name:<42}");
            for c in &cols {
                let _ = write!(table, " {c:>9.2}");
            }
            table.push('\n');
        }
    }
    let got = p.counters(s)?;
    // The empty kernel keeps no counter.
    let short: Vec<String> = Probe::ALL
        .iter()
        .zip(got.iter().zip(expected.iter()))
        .skip(1)
        .filter(|(_, (g, e))| g != e)
        .map(|(p, (g, e))| format!("{}: counter {g}, expected {e}", p.name()))
        .collect();
    if st.rank == 0 {
        let modes: Vec<&str> = args.modes.iter().map(|m| m.name()).collect();
        println!(
            "# latency probes: median us per launch, {iters} launches per round, {} rounds",
            args.rounds
        );
        println!(
            "{:<42} {}",
            "probe",
            modes.iter().map(|m| format!("{m:>9}")).collect::<Vec<_>>().join(" ")
        );
        print!("{table}");
    }
    if !short.is_empty() {
        return Err(format!("rank {}: probes did not complete: {}", st.rank, short.join("; ")).into());
    }
    Ok(())
}

/// `--probe-bw`: SM copy kernel and copy engine, reading from or writing to the next rank's
/// memory, with every rank copying at once ("both") and with rank 0 alone ("one"); per size
/// (`--sizes`, bytes moved per rank and direction), median us per copy of the slowest copying
/// rank and GB/s per direction. `sm+ce` splits the bytes half and half between the SM kernel
/// and the copy engine on a second stream, both running at once.
pub(crate) fn bandwidth_probes(sh: &Shared, st: &RankState) -> BoxResult<()> {
    use symm_ops::symm_cuda::probe::BandwidthProbe;
    let args = &sh.args;
    let max = args.sizes.iter().copied().max().unwrap_or(MIB).div_ceil(4096) * 4096;
    let g = Group::new(format!("{}-probe-bw", sh.run_id), st.rank, st.world, sh.store.clone())?;
    let a = get_allocator(DeviceType::Cuda)?.alloc(2 * max, Device::cuda(st.rank as u32), &g)?;
    let m = a.rendezvous(T_STORE)?;
    let own = m.buffer_ptrs()[st.rank];
    let peer = m.buffer_ptrs()[(st.rank + 1) % st.world];
    let p = BandwidthProbe::new(&st.ctx, st.coll.sm_count())?;
    let side = st.stream.fork()?;
    let s = &st.stream;
    // Source [0, max), destination [max, 2 max) on every rank.
    // SAFETY: `own` is this rank's buffer of 2 * max bytes (alive until the end of this function,
    // after the stream is synchronised); the memset covers its first half.
    unsafe { memset_d32_async(s, own, 0x3f80_3f80, max / 2)? };
    s.synchronize()?;
    let iters = args.iters.unwrap_or(10);
    let mut table = String::new();
    for &size in &args.sizes {
        let bytes = size.div_ceil(16) * 16;
        let half = (bytes / 2).div_ceil(16) * 16;
        for engine in ["sm", "ce", "sm+ce"] {
            for dir in ["read", "write"] {
                for who in ["both", "one"] {
                    let active = who == "both" || st.rank == 0;
                    // read: own dst <- peer src; write: peer dst <- own src.
                    let (dst, src) = if dir == "read" {
                        (own + max as u64, peer)
                    } else {
                        (peer + max as u64, own)
                    };
                    let mut run = |_: usize| -> BoxResult<()> {
                        if !active {
                            return Ok(());
                        }
                        // SAFETY: `src` and `dst` are `bytes`-long halves of the rank's own or the
                        // peer's 2 * max-byte probe buffer (`bytes <= max`), mapped until the
                        // stream is synchronised at the end of this size.
                        unsafe {
                            match engine {
                                "sm" => p.sm_copy(s, dst, src, bytes)?,
                                "ce" => p.ce_copy(s, dst, src, bytes)?,
                                _ => {
                                    side.join(s)?;
                                    p.ce_copy(&side, dst + half as u64, src + half as u64, bytes - half)?;
                                    p.sm_copy(s, dst, src, half)?;
                                    s.join(&side)?;
                                }
                            }
                        }
                        Ok(())
                    };
                    run(0)?;
                    let mut times = time_rounds(st, Mode::Eager, iters, args.rounds, &mut run)?;
                    s.synchronize()?;
                    let mine = if active { median(&mut times) } else { 0.0 };
                    let key = sh.next_key(st.rank, &format!("probe-bw-{size}-{engine}-{dir}-{who}"));
                    let all = gather_f64s(sh, st.rank, &key, &[mine])?;
                    let us = all.iter().filter_map(|v| v.first().copied()).fold(0.0, f64::max);
                    let _ = writeln!(
                        table,
                        "{:>10} {engine:>6} {dir:>6} {who:>5} {us:>10.2} {:>8.1}",
                        fmt_size(size),
                        bytes as f64 / us / 1e3
                    );
                }
            }
        }
    }
    if st.rank == 0 {
        println!(
            "# bandwidth probes: median us per copy ({iters} copies per round, {} rounds), GB/s per direction",
            args.rounds
        );
        println!(
            "{:>10} {:>6} {:>6} {:>5} {:>10} {:>8}",
            "size", "engine", "dir", "ranks", "us", "GB/s"
        );
        print!("{table}");
    }
    Ok(())
}
