//! The engine's backend, chosen at run time: [`AnyBackend`] holds the CPU
//! or the CUDA backend, and [`AnyPending`] the pending state of a version
//! either made. Each backend sees only its own [`Backend::Pending`] type;
//! the one check that a version goes back to the backend that made it is
//! here, and failing it is a bug ([`foreign`]).

use super::cpu::{CpuBackend, CpuPending};
use super::cuda::{CudaBackend, GpuPending};
use super::{
    Backend, BackendKind, Deduplicated, DiffBytes, GivenAway, Handed, PendingVersion, Sink, StepDiff, VersionMut,
    budget, foreign,
};
use crate::diff::Diff;
use crate::error::Result;
use crate::layout::Layout;
use crate::memory::{Protected, ProtectedMut};
use crate::regions::{Conversion, FirstBytes, Region, Rewrite};

/// The CPU or the CUDA backend.
#[derive(Debug)]
pub enum AnyBackend {
    /// De-duplication on the CPU.
    Cpu(CpuBackend),
    /// De-duplication on a CUDA device.
    Cuda(Box<CudaBackend>),
}

/// The pending state of a version [`AnyBackend`] made.
#[derive(Debug)]
pub enum AnyPending {
    /// Made by the CPU backend.
    Cpu(CpuPending),
    /// Made by the CUDA backend.
    Cuda(Box<GpuPending>),
}

impl From<CpuBackend> for AnyBackend {
    fn from(b: CpuBackend) -> Self {
        AnyBackend::Cpu(b)
    }
}

impl From<CudaBackend> for AnyBackend {
    fn from(b: CudaBackend) -> Self {
        AnyBackend::Cuda(Box::new(b))
    }
}

impl PendingVersion for AnyPending {
    fn first_bytes<'a>(&'a self, diff: &'a Diff, data: &'a [u8]) -> Result<FirstBytes<'a>> {
        match self {
            AnyPending::Cpu(p) => p.first_bytes(diff, data),
            AnyPending::Cuda(p) => p.first_bytes(diff, data),
        }
    }

    fn give_away(&mut self, diff: &mut Diff, conv: &[Conversion], layouts: &[Layout]) -> Result<()> {
        match self {
            AnyPending::Cpu(p) => p.give_away(diff, conv, layouts),
            AnyPending::Cuda(p) => p.give_away(diff, conv, layouts),
        }
    }
}

fn cpu_version(d: Deduplicated<CpuPending>) -> Deduplicated {
    d.map_pending(AnyPending::Cpu)
}

fn cuda_version(d: Deduplicated<GpuPending>) -> Deduplicated {
    d.map_pending(|p| AnyPending::Cuda(Box::new(p)))
}

/// A version of the CPU backend, or [`foreign`].
fn into_cpu(d: Deduplicated) -> Result<Deduplicated<CpuPending>> {
    let Deduplicated { diff, pending, gpu } = d;
    match pending {
        AnyPending::Cpu(pending) => Ok(Deduplicated { diff, pending, gpu }),
        AnyPending::Cuda(_) => Err(foreign()),
    }
}

/// A version of the CUDA backend, or [`foreign`].
fn into_cuda(d: Deduplicated) -> Result<Deduplicated<GpuPending>> {
    let Deduplicated { diff, pending, gpu } = d;
    match pending {
        AnyPending::Cuda(pending) => Ok(Deduplicated { diff, pending: *pending, gpu }),
        AnyPending::Cpu(_) => Err(foreign()),
    }
}

fn any_handed<P>(h: Handed<P>, wrap: fn(Deduplicated<P>) -> Deduplicated) -> Handed
where
    P: PendingVersion,
{
    Handed {
        pending: h.pending.map(wrap),
        baseline: h.baseline,
        describe: h.describe.map(|describe| -> super::Describe {
            Box::new(move |read| describe(read).map(|(d, start)| (wrap(d), start)))
        }),
        gpu: h.gpu,
    }
}

/// Runs `$body` with `$b` the backend and `$v` the version's typed view
/// (`VersionMut` of the backend's own pending type), or fails as
/// [`foreign`].
macro_rules! typed_mut {
    ($self:expr, $version:expr, |$b:ident, $v:ident| $body:expr) => {{
        let VersionMut { diff, pending, gpu } = $version;
        match ($self, pending) {
            (AnyBackend::Cpu($b), AnyPending::Cpu(p)) => {
                let $v = VersionMut { diff, pending: p, gpu };
                $body
            }
            (AnyBackend::Cuda($b), AnyPending::Cuda(p)) => {
                let $v = VersionMut { diff, pending: &mut **p, gpu };
                $body
            }
            _ => Err(foreign()),
        }
    }};
}

/// Runs `$body` with `$b` the inner backend, whichever it is.
macro_rules! each {
    ($self:expr, |$b:ident| $body:expr) => {
        match $self {
            AnyBackend::Cpu($b) => $body,
            AnyBackend::Cuda($b) => $body,
        }
    };
}

impl Backend for AnyBackend {
    type Pending = AnyPending;

    fn kind(&self) -> BackendKind {
        each!(self, |b| b.kind())
    }

    fn record_entries(&self) -> u64 {
        each!(self, |b| b.record_entries())
    }

    fn bounds_hit(&self) -> crate::dedup::BoundsHit {
        each!(self, |b| b.bounds_hit())
    }

    fn device_plan(&self) -> Option<budget::DevicePlan> {
        each!(self, |b| b.device_plan())
    }

    fn deduplicate(&mut self, version: u64, input: Protected<'_>, baseline: bool) -> Result<Deduplicated> {
        match self {
            AnyBackend::Cpu(b) => b.deduplicate(version, input, baseline).map(cpu_version),
            AnyBackend::Cuda(b) => b.deduplicate(version, input, baseline).map(cuda_version),
        }
    }

    fn regions(&mut self, diff: &Diff, pending: &AnyPending, data: &[u8], max_level: u32) -> Result<Vec<Region>> {
        match (self, pending) {
            (AnyBackend::Cpu(b), AnyPending::Cpu(p)) => b.regions(diff, p, data, max_level),
            (AnyBackend::Cuda(b), AnyPending::Cuda(p)) => b.regions(diff, p, data, max_level),
            _ => Err(foreign()),
        }
    }

    fn serialize<'a>(&'a mut self, version: VersionMut<'_, AnyPending>, data: &[u8]) -> Result<DiffBytes<'a>> {
        typed_mut!(self, version, |b, v| b.serialize(v, data))
    }

    fn serialize_deferred<'a>(
        &'a mut self,
        version: VersionMut<'_, AnyPending>,
        data: &[u8],
    ) -> Result<(DiffBytes<'a>, Option<Rewrite>)> {
        typed_mut!(self, version, |b, v| b.serialize_deferred(v, data))
    }

    fn commit_before_step(&mut self, handed: Handed) -> Result<StepDiff> {
        let Handed { pending, baseline, describe, gpu } = handed;
        match self {
            AnyBackend::Cpu(b) => {
                let pending = pending.map(into_cpu).transpose()?;
                b.commit_before_step(Handed { pending, baseline, describe: None, gpu })
            }
            AnyBackend::Cuda(b) => {
                let describe = describe.map(|describe| -> super::Describe<_> {
                    Box::new(move |read| describe(read).and_then(|(d, start)| Ok((into_cuda(d)?, start))))
                });
                b.commit_before_step(Handed { pending: None, baseline, describe, gpu })
            }
        }
    }

    fn settle_step(&mut self, version: u64, given: GivenAway<'_>) -> Result<()> {
        each!(self, |b| b.settle_step(version, given))
    }

    fn commit(&mut self, version: Deduplicated) -> Result<()> {
        match self {
            AnyBackend::Cpu(b) => b.commit(into_cpu(version)?),
            AnyBackend::Cuda(b) => b.commit(into_cuda(version)?),
        }
    }

    fn rollback(&mut self) -> Result<()> {
        each!(self, |b| b.rollback())
    }

    fn place(&self, bytes: &[u8], dst: ProtectedMut<'_>) -> Result<()> {
        each!(self, |b| b.place(bytes, dst))
    }

    fn rebuild_from(&mut self, version: u64, data: Protected<'_>, map: crate::restore::PendingMap) -> Result<()> {
        each!(self, |b| b.rebuild_from(version, data, map))
    }

    fn host_segments(&self, base: Option<crate::memory::SegmentAlloc>) -> Option<crate::memory::SegmentAlloc> {
        each!(self, |b| b.host_segments(base))
    }

    fn hand_over_new(&mut self, version: u64, input: Protected<'_>, baseline: bool, sink: Sink<'_>) -> Result<Handed> {
        match self {
            AnyBackend::Cpu(b) => b.hand_over_new(version, input, baseline, sink).map(|h| any_handed(h, cpu_version)),
            AnyBackend::Cuda(b) => b.hand_over_new(version, input, baseline, sink).map(|h| any_handed(h, cuda_version)),
        }
    }
}
