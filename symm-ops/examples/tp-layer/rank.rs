//! One tensor-parallel rank: its weight shards and KV cache (cudarc slices), its activations
//! (symmetric memory from its communicator), and the layer's forward pass on its stream, as an
//! engine's worker runs it.

use std::sync::Arc;

use symm_ops::cudarc::cublas::CudaBlas;
use symm_ops::cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use symm_ops::cudarc::driver::{CudaSlice, CudaStream};
use symm_ops::half::bf16;
use symm_ops::prelude::*;
use symm_ops::{AllReduceAlgo, EpilogueAlgo, RmsNorm, SymmBuffer};

use crate::gpu::{self, linear, Kernels, CHUNK};
use crate::group::RankBarrier;
use crate::model::{Shape, Shard, Tensor, HEAD_DIM};
use crate::Res;
use symm_ops::symm_cuda::streams::wait_idle;

/// Bound on every host wait for a rank's stream: longer than an op's own device timeout (60 s),
/// so a stuck collective reports its own error first; NCCL's waits have no bound of their own.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Waits until `stream` is idle, at most [`DRAIN_TIMEOUT`] (symm-cuda's `wait_idle`: polls, holds
/// no driver lock, gives the failed operation's error).
fn drain(stream: &CudaStream, what: &str) -> Res {
    Ok(wait_idle(stream, DRAIN_TIMEOUT, what)?)
}

/// How the layer's two all-reduces and their residual + RMSNorm epilogues run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// No collective: the residual add and norm on this rank's partial sums alone. At TP 1
    /// this is the layer; above it is the compute floor (its output is not the layer's).
    None,
    /// NCCL's all-reduce, then the separate residual + RMSNorm kernel.
    Nccl,
    /// symm's all-reduce (the planner's pick for the message), then the separate kernel.
    Symm,
    /// symm's fused all-reduce + residual + RMSNorm (one kernel).
    Fused,
    /// What `all_reduce_residual_rms_norm` picks by itself.
    Auto,
    /// A signal-pad barrier of the group where each all-reduce was, then the separate kernel on
    /// this rank's partial sums: not the layer (nothing is reduced), but its time over `none`
    /// is what the ranks' skew and one synchronisation cost, without moving data.
    Barrier,
}

impl Mode {
    pub const ALL: [Mode; 6] = [
        Mode::None,
        Mode::Nccl,
        Mode::Symm,
        Mode::Fused,
        Mode::Auto,
        Mode::Barrier,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Nccl => "nccl",
            Mode::Symm => "symm",
            Mode::Fused => "fused",
            Mode::Auto => "auto",
            Mode::Barrier => "barrier",
        }
    }

    /// Whether the mode computes the layer (above TP 1 `none` and `barrier` do not reduce).
    pub fn is_layer(self) -> bool {
        !matches!(self, Mode::None | Mode::Barrier)
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// Eager launches or a CUDA graph of several layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exec {
    Eager,
    Graph,
}

impl Exec {
    pub fn name(self) -> &'static str {
        match self {
            Exec::Eager => "eager",
            Exec::Graph => "graph",
        }
    }
}

struct Weights {
    in_norm: CudaSlice<bf16>,
    qkv: CudaSlice<bf16>,
    o: CudaSlice<bf16>,
    post_norm: CudaSlice<bf16>,
    gate_up: CudaSlice<bf16>,
    down: CudaSlice<bf16>,
    k_cache: CudaSlice<bf16>,
    v_cache: CudaSlice<bf16>,
}

/// A step's activations for `tokens` tokens. What feeds or leaves a collective is symmetric
/// memory from the communicator; the rest is the rank's own.
pub struct Acts {
    tokens: usize,
    qkv: CudaSlice<bf16>,
    attn: CudaSlice<bf16>,
    part_o: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    gate_up: CudaSlice<bf16>,
    act: CudaSlice<bf16>,
    /// The O projection's partial sums (row-parallel), all-reduced.
    o_part: SymmBuffer<bf16>,
    /// The down projection's partial sums, all-reduced.
    down_part: SymmBuffer<bf16>,
    /// The residual stream, in and out of each epilogue in turn.
    res: [SymmBuffer<bf16>; 2],
    /// The normed activations the next GEMM reads.
    normed: SymmBuffer<bf16>,
}

/// A rank's layer outputs after one checked step: the residual stream and its norm, widened.
pub struct Outputs {
    pub residual: Vec<f64>,
    pub norm: Vec<f64>,
}

pub struct Rank {
    pub comm: Communicator,
    pub stream: Arc<CudaStream>,
    blas: CudaBlas,
    k: Kernels,
    s: Shape,
    lmax: usize,
    seed: u64,
    w: Weights,
    /// Ranks sharing a GPU: every rank's stream drained and the ranks met before each
    /// collective. symm's grids are sized so that every rank's collectives are resident
    /// together (NOTE [co-residency]), but a cuBLAS GEMM queued behind nothing on one rank can
    /// need SMs a peer's spinning collective holds, and some of its kernels keep blocks waiting
    /// for other blocks of their grid: with 4 and more ranks on one H200 the layer hung in its
    /// first all-reduce without this. Correctness only: shared groups are not timed.
    fence: Option<Arc<RankBarrier>>,
}

impl Rank {
    /// Builds the rank's weights and cache (`lmax` positions) on `stream`.
    pub fn new(
        comm: Communicator,
        stream: Arc<CudaStream>,
        k: Kernels,
        s: Shape,
        lmax: usize,
        seed: u64,
        fence: Option<Arc<RankBarrier>>,
    ) -> Res<Rank> {
        let (tp, rank) = (comm.world_size(), comm.rank().get());
        s.check_tp(tp)?;
        let blas = CudaBlas::new(stream.clone())?;
        let sharers = comm.device_sharers();
        if sharers > 1 {
            // Leave the peers' collectives their SMs (the grid budget's share, less its reserve).
            let sms = stream
                .context()
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            gpu::limit_gemm_sms(&blas, (sms as usize / sharers).saturating_sub(2))?;
        }
        let make = |t: Tensor| -> Res<CudaSlice<bf16>> {
            let shard = Shard::new(t, &s, tp, rank, 1, lmax);
            let mut b = stream.alloc_zeros::<bf16>(shard.rows * shard.cols)?;
            k.init(&stream, &mut b, &shard, &s, seed)?;
            Ok(b)
        };
        let w = Weights {
            in_norm: make(Tensor::InNorm)?,
            qkv: make(Tensor::Qkv)?,
            o: make(Tensor::O)?,
            post_norm: make(Tensor::PostNorm)?,
            gate_up: make(Tensor::GateUp)?,
            down: make(Tensor::Down)?,
            k_cache: make(Tensor::KCache)?,
            v_cache: make(Tensor::VCache)?,
        };
        drain(&stream, "weights")?;
        Ok(Rank {
            comm,
            stream,
            blas,
            k,
            s,
            lmax,
            seed,
            w,
            fence,
        })
    }

    fn tp(&self) -> usize {
        self.comm.world_size()
    }

    fn rank(&self) -> usize {
        self.comm.rank().get()
    }

    /// Activations for `tokens` tokens (every rank allocates them in the same order).
    pub fn acts(&self, tokens: usize) -> Res<Acts> {
        let (s, l) = (&self.s, self.s.local(self.tp()));
        let nchunk = self.lmax.div_ceil(CHUNK);
        let st = &self.stream;
        let th = tokens * s.hidden;
        Ok(Acts {
            tokens,
            qkv: st.alloc_zeros(tokens * (l.q_heads + 2 * l.kv_heads) * HEAD_DIM)?,
            attn: st.alloc_zeros(tokens * l.q_heads * HEAD_DIM)?,
            part_o: st.alloc_zeros(tokens * l.q_heads * nchunk * HEAD_DIM)?,
            part_ml: st.alloc_zeros(tokens * l.q_heads * nchunk * 2)?,
            gate_up: st.alloc_zeros(tokens * 2 * l.inter)?,
            act: st.alloc_zeros(tokens * l.inter)?,
            o_part: self.comm.alloc(th)?,
            down_part: self.comm.alloc(th)?,
            res: [self.comm.alloc(th)?, self.comm.alloc(th)?],
            normed: self.comm.alloc(th)?,
        })
    }

    /// The epilogue `mode` would run for `acts` (for the report): the algorithm's name.
    pub fn algo_name(&self, mode: Mode, acts: &Acts) -> String {
        let bytes = acts.tokens * self.s.hidden * 2;
        match self.epilogue_algo(mode, bytes) {
            None if mode == Mode::Barrier => "barrier+norm kernel".into(),
            None => "add+norm kernel".into(),
            Some(EpilogueAlgo::Separate(a)) => format!("{a:?}+norm"),
            Some(EpilogueAlgo::Auto) => format!(
                "auto={:?}",
                self.comm.select_epilogue(acts.tokens, self.s.hidden, DType::BF16)
            ),
            Some(a) => format!("{a:?}"),
        }
    }

    fn epilogue_algo(&self, mode: Mode, bytes: usize) -> Option<EpilogueAlgo> {
        Some(match mode {
            Mode::None | Mode::Barrier => return None,
            Mode::Nccl => EpilogueAlgo::Separate(AllReduceAlgo::Nccl),
            Mode::Symm => EpilogueAlgo::Separate(self.comm.select_all_reduce(bytes)),
            Mode::Fused => EpilogueAlgo::Fused,
            Mode::Auto => EpilogueAlgo::Auto,
        })
    }

    /// `res_out = res_in + all_reduce(part)`, `normed = RMSNorm(res_out) * w`, by `mode`.
    #[allow(clippy::too_many_arguments)]
    fn epilogue(
        &self,
        mode: Mode,
        part: &SymmBuffer<bf16>,
        res_in: &SymmBuffer<bf16>,
        res_out: &mut SymmBuffer<bf16>,
        w: &CudaSlice<bf16>,
        normed: &mut SymmBuffer<bf16>,
        tokens: usize,
    ) -> Res {
        let (st, s) = (&self.stream, &self.s);
        let algo = self.epilogue_algo(mode, tokens * s.hidden * 2);
        if let (true, Some(fence)) = (algo.is_some() || mode == Mode::Barrier, &self.fence) {
            drain(st, "before a collective")?;
            fence.wait()?;
        }
        if mode == Mode::Barrier {
            self.comm.on(st).barrier(None)?;
        }
        match algo {
            None => self.k.add_rms_norm(
                st,
                part.view()?,
                Some((res_in.view()?, res_out.view_mut()?)),
                w,
                normed.view_mut()?,
                tokens,
                s.hidden,
                s.eps,
            ),
            Some(algo) => Ok(self.comm.on(st).all_reduce_residual_rms_norm_with(
                algo,
                part,
                res_in,
                RmsNorm::new(w, s.eps),
                normed,
                res_out,
            )?),
        }
    }

    /// One decoder layer: reads `normed` (this layer's normed input) and `res[0]`; leaves the
    /// residual stream in `res[0]` and the next layer's normed input in `normed`.
    pub fn layer(&mut self, a: &mut Acts, mode: Mode, kv_len: usize) -> Res {
        let (s, l, t) = (self.s, self.s.local(self.tp()), a.tokens);
        let st = self.stream.clone();
        let (q, kv) = (l.q_heads, l.kv_heads);
        linear(
            &self.blas,
            a.normed.view()?,
            &self.w.qkv,
            &mut a.qkv,
            (t, (q + 2 * kv) * HEAD_DIM, s.hidden),
        )?;
        let w = &mut self.w;
        self.k.rope_kv(
            &st,
            &mut a.qkv,
            &mut w.k_cache,
            &mut w.v_cache,
            (q, kv),
            t,
            (kv_len, self.lmax),
            s.rope_theta,
        )?;
        self.k.attention(
            &st,
            &a.qkv,
            (&self.w.k_cache, &self.w.v_cache),
            (&mut a.part_o, &mut a.part_ml),
            &mut a.attn,
            (q, kv),
            t,
            (kv_len, self.lmax),
        )?;
        linear(
            &self.blas,
            &a.attn,
            &self.w.o,
            a.o_part.view_mut()?,
            (t, s.hidden, q * HEAD_DIM),
        )?;
        let [r0, r1] = &mut a.res;
        self.epilogue(mode, &a.o_part, r0, r1, &self.w.post_norm, &mut a.normed, t)?;
        linear(
            &self.blas,
            a.normed.view()?,
            &self.w.gate_up,
            &mut a.gate_up,
            (t, 2 * l.inter, s.hidden),
        )?;
        self.k.silu_mul(&st, &a.gate_up, &mut a.act, t, l.inter)?;
        linear(
            &self.blas,
            &a.act,
            &self.w.down,
            a.down_part.view_mut()?,
            (t, s.hidden, l.inter),
        )?;
        self.epilogue(mode, &a.down_part, r1, r0, &self.w.in_norm, &mut a.normed, t)
    }

    /// One layer without collectives and a synchronisation: loads every kernel the step
    /// launches for these shapes (cuBLAS picks and loads its GEMM kernels at first use).
    pub fn warm_up(&mut self, a: &mut Acts) -> Res {
        self.layer(a, Mode::None, 0)?;
        drain(&self.stream, "warm-up")
    }

    /// One checked step from the fixed input: a fresh cache, the input RMSNorm, one layer;
    /// returns what this rank holds afterwards.
    pub fn check(&mut self, a: &mut Acts, mode: Mode, kv_len: usize) -> Res<Outputs> {
        let (s, t, st) = (self.s, a.tokens, self.stream.clone());
        for tensor in [Tensor::KCache, Tensor::VCache] {
            let shard = Shard::new(tensor, &s, self.tp(), self.rank(), t, self.lmax);
            let cache = if tensor == Tensor::KCache {
                &mut self.w.k_cache
            } else {
                &mut self.w.v_cache
            };
            self.k.init(&st, cache, &shard, &s, self.seed)?;
        }
        let input = Shard::new(Tensor::Input, &s, self.tp(), self.rank(), t, self.lmax);
        self.k.init(&st, a.res[0].view_mut()?, &input, &s, self.seed)?;
        self.k.add_rms_norm(
            &st,
            a.res[0].view()?,
            None::<(&CudaSlice<bf16>, &mut CudaSlice<bf16>)>,
            &self.w.in_norm,
            a.normed.view_mut()?,
            t,
            s.hidden,
            s.eps,
        )?;
        self.layer(a, mode, kv_len)?;
        drain(&st, "checked step")?;
        let widen = |v: Vec<bf16>| v.into_iter().map(|x| x.to_f64()).collect();
        Ok(Outputs {
            residual: widen(st.clone_dtoh(a.res[0].view()?)?),
            norm: widen(st.clone_dtoh(a.normed.view()?)?),
        })
    }

    /// `mode`'s timed execution, warmed up and ready for [`Rank::round`]: `layers` layers per
    /// round, launched one by one (eager) or as one CUDA graph of them. Several modes' timers
    /// live at once, so their rounds interleave (the group's plan).
    pub fn timer(&mut self, a: &mut Acts, mode: Mode, kv_len: usize, exec: Exec, layers: usize) -> Res<Timer> {
        let st = self.stream.clone();
        // Warm-up, eager: cuBLAS loads its kernels outside any capture.
        for _ in 0..2 {
            self.layer(a, mode, kv_len)?;
        }
        drain(&st, "warm-up")?;
        let graph = match exec {
            Exec::Eager => None,
            Exec::Graph => {
                st.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
                let captured = (0..layers).try_for_each(|_| self.layer(a, mode, kv_len));
                let graph = st.end_capture(CUgraphInstantiate_flags(0))?;
                captured?; // the capture ended before its error is returned
                let graph = graph.ok_or("the capture recorded nothing")?;
                graph.launch()?;
                drain(&st, "graph warm-up")?;
                Some(graph)
            }
        };
        Ok(Timer {
            mode,
            kv_len,
            layers,
            graph,
        })
    }

    /// One timed round of `t`: microseconds per layer (a graph is replayed [`Timer::REPLAYS`]
    /// times a round).
    pub fn round(&mut self, a: &mut Acts, t: &Timer) -> Res<f64> {
        let st = self.stream.clone();
        let event = || st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        let e0 = event()?;
        let per_round = match &t.graph {
            None => {
                for _ in 0..t.layers {
                    self.layer(a, t.mode, t.kv_len)?;
                }
                t.layers
            }
            Some(graph) => {
                for _ in 0..Timer::REPLAYS {
                    graph.launch()?;
                }
                Timer::REPLAYS * t.layers
            }
        };
        let e1 = event()?;
        drain(&st, "timed round")?;
        self.comm.check_error()?;
        Ok(e0.elapsed_ms(&e1)? as f64 * 1e3 / per_round as f64)
    }

    /// Microseconds per layer of `mode` alone, one figure per round ([`Rank::timer`], then
    /// `rounds` rounds).
    pub fn time(
        &mut self,
        a: &mut Acts,
        mode: Mode,
        kv_len: usize,
        exec: Exec,
        layers: usize,
        rounds: usize,
    ) -> Res<Vec<f64>> {
        let t = self.timer(a, mode, kv_len, exec, layers)?;
        (0..rounds).map(|_| self.round(a, &t)).collect()
    }
}

/// One mode's timed execution ([`Rank::timer`]): its eager layers, or its captured graph.
pub struct Timer {
    mode: Mode,
    kv_len: usize,
    layers: usize,
    graph: Option<symm_ops::cudarc::driver::CudaGraph>,
}

impl Timer {
    /// Graph replays per timed round.
    const REPLAYS: usize = 4;
}
