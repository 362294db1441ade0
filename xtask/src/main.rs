//! # xtask
//!
//! Project automation for symm, run as `cargo xtask <command>` (the alias is
//! in `.cargo/config.toml`):
//!
//! - `ci`: what `.ci/run` runs: fmt, build, tests, NVRTC kernel compile, the
//!   ROCm check, the benchmark smoke test; ends with `N passed, N failed`.
//! - `kernels [--arch sm_80,sm_90]`: NVRTC-compiles every CUDA kernel (default: sm_80 and sm_90).
//! - `embed [--update-locks]`: builds and runs the programs that embed symm-ops out of tree
//!   (xtask/embed-check, xtask/embed-candle, docs/embedding.md's program), as CI's build step
//!   does; `--update-locks` refreshes their committed locks first.
//! - `test-multigpu [test args]`: the GPU suites on this machine's GPUs (>= 2).
//! - `gpu-bundle [--out .gpu]`: GPU test and benchmark executables plus
//!   `run.sh`, for a GPU machine without cargo.
//! - `bench [--quick] [--out DIR] [args]`: the benchmark, JSON and SVG plot;
//!   `bench --tp-layer [args]`: the tensor-parallel decoder layer instead.
//! - `plot BENCH.json [--out PLOT.svg] [--anchors ANCHORS.json]`: the plots alone
//!   (PLOT.svg: ours against NCCL; PLOT-detail.svg: every algorithm).

#![forbid(unsafe_code)]

mod bench;
mod ci;
mod embed;
mod gpu;
mod kernels;
mod plot;
mod util;

const USAGE: &str = "usage: cargo xtask <command> [args]

commands:
  ci                          everything CI checks (what .ci/run runs)
  kernels [--arch sm_80,sm_90] NVRTC-compile every CUDA kernel for sm_80 and sm_90 (needs libnvrtc)
  embed [--update-locks]      build and run the out-of-tree embedding programs (embed-check,
                              embed-candle, docs/embedding.md's program); refresh their locks first
  test-multigpu [test args]   build and run the GPU test suites here (one GPU: shared-device worlds)
  gpu-bundle [--out .gpu]     build GPU tests + binaries + run.sh for a GPU machine without cargo
  bench [--quick] [--out DIR] [args]
                              run symm-bench (GPU when present, host backend otherwise);
                              JSON + SVG plot in DIR (default target/bench)
  bench --tp-layer [--out DIR] [args]
                              the tensor-parallel Llama layer (symm-ops example tp-layer; needs a GPU)
  plot BENCH.json [--out PLOT.svg] [--anchors ANCHORS.json]
                              plot a symm-bench JSON file (and PLOT-detail.svg)";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((cmd, rest)) = args.split_first() else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let r = match cmd.as_str() {
        "ci" => ci::main(rest),
        "kernels" => kernels::main(rest),
        "embed" => embed::main(rest),
        "test-multigpu" => gpu::test_multigpu(rest),
        "gpu-bundle" => gpu::gpu_bundle(rest),
        "bench" => bench::main(rest),
        "plot" => plot::main(rest),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
