//! [`CudaBackend`]: the [`Backend`] contract over a [`GpuDedup`]. The file a
//! version produces stays in pinned memory until the store writes it (the
//! single-rank path), or is copied to host memory for the collective step,
//! which reads its FIRST bytes and may rewrite it.

use super::{GpuDedup, cuda_err};
use crate::backend::{Backend, BackendKind, Deduplicated, DiffBytes, PendingVersion, foreign};
use crate::dedup::record_entries;
use crate::diff::Diff;
use crate::format::{encode_meta, finish_body};
use crate::hash::Digest;
use crate::layout::Layout;
use crate::memory::{Protected, ProtectedMut};
use crate::record::RecordEntry;
use crate::regions::{self, Conversion, FirstBytes};
use crate::{Error, Result};
use std::any::Any;

/// De-duplication on a CUDA device.
pub struct CudaBackend {
    dev: GpuDedup,
}

impl CudaBackend {
    /// The backend over a device pipeline (fresh or rebuilt).
    pub fn new(dev: GpuDedup) -> Self {
        CudaBackend { dev }
    }
}

/// Where a GPU diff file's bytes are.
#[derive(Debug)]
enum GpuFile {
    /// Still in the pipeline's pinned output buffer: the whole file's length
    /// and its trailer.
    Pinned { file_len: usize, trailer: [u8; 32] },
    /// Copied to host memory (the collective path reads and may rewrite it).
    Host(Vec<u8>),
}

/// A GPU version: its file, FIRST data at `data_start`; the device holds the
/// pending record. `moved` are entries to point at other ranks' copies,
/// `forget` digests to drop from it (regions given away).
#[derive(Debug)]
struct GpuPending {
    file: GpuFile,
    data_start: usize,
    dense: bool,
    moved: Vec<(Digest, RecordEntry)>,
    forget: Vec<Digest>,
}

fn pinned_here() -> Error {
    Error::Internal("a GPU diff still in pinned memory cannot take part in a collective step".into())
}

impl PendingVersion for GpuPending {
    fn first_bytes<'a>(&'a self, diff: &'a Diff, _: &'a [u8]) -> Result<FirstBytes<'a>> {
        match &self.file {
            GpuFile::Host(file) => {
                let data = file
                    .get(self.data_start..self.data_start + diff.data_bytes() as usize)
                    .ok_or_else(|| Error::Internal("GPU diff data".into()))?;
                Ok(FirstBytes::gathered(diff, data))
            }
            GpuFile::Pinned { .. } => Err(pinned_here()),
        }
    }

    fn give_away(&mut self, diff: &mut Diff, conv: &[Conversion], layouts: &[Layout]) -> Result<()> {
        if conv.is_empty() {
            return Ok(());
        }
        let GpuFile::Host(file) = &mut self.file else { return Err(pinned_here()) };
        let (me, layout) = (diff.rank, diff.layout);
        let before = diff.clone();
        regions::apply(diff, conv);
        let first_data = file
            .get(self.data_start..self.data_start + before.data_bytes() as usize)
            .ok_or_else(|| Error::Internal("GPU diff data".into()))?;
        let kept = FirstBytes::gathered(&before, first_data).gather(&diff.first);
        if !self.dense {
            // What the device inserted for this version (the entries the
            // CPU's pending record holds), moved as the CPU moves them.
            for (d, e) in record_entries(&before, first_data) {
                match regions::relocate(&e, me, &layout, conv, layouts) {
                    Some(m) if m == e => {}
                    Some(m) => self.moved.push((d, m)),
                    None => self.forget.push(d),
                }
            }
        }
        let mut body = encode_meta(diff);
        self.data_start = body.len();
        body.extend_from_slice(&kept);
        *file = finish_body(body, self.data_start);
        Ok(())
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn record_entries(&self) -> u64 {
        self.dev.record_entries()
    }

    fn deduplicate(
        &mut self,
        version: u64,
        input: Protected<'_>,
        baseline: bool,
        for_collective: bool,
    ) -> Result<Deduplicated> {
        let cp = self.dev.checkpoint(version, input, baseline)?;
        let file = if for_collective {
            GpuFile::Host(self.dev.file_vec(&cp)?)
        } else {
            GpuFile::Pinned { file_len: cp.file_len, trailer: cp.trailer }
        };
        let pending =
            GpuPending { file, data_start: cp.data_start, dense: cp.diff.dense, moved: Vec::new(), forget: Vec::new() };
        Ok(Deduplicated { diff: cp.diff, pending: Box::new(pending), gpu: Some(cp.timings) })
    }

    fn serialize<'a>(&'a mut self, version: &mut Deduplicated, _: &[u8]) -> Result<DiffBytes<'a>> {
        let p = version.pending.as_any_mut().downcast_mut::<GpuPending>().ok_or_else(foreign)?;
        self.dev.forget(&std::mem::take(&mut p.forget))?;
        self.dev.relocate(&std::mem::take(&mut p.moved))?;
        match &mut p.file {
            GpuFile::Host(bytes) => Ok(DiffBytes::Owned(std::mem::take(bytes))),
            GpuFile::Pinned { file_len, trailer } => {
                Ok(DiffBytes::Borrowed { prefix: self.dev.pinned_prefix(*file_len)?, trailer: *trailer })
            }
        }
    }

    fn commit(&mut self, version: Deduplicated) -> Result<()> {
        version.pending.into_any().downcast::<GpuPending>().map_err(|_| foreign())?;
        self.dev.commit()
    }

    fn rollback(&mut self) -> Result<()> {
        self.dev.rollback()
    }

    fn place(&self, bytes: &[u8], dst: ProtectedMut<'_>) -> Result<()> {
        if bytes.len() != dst.len() {
            return Err(Error::InvalidOption(format!(
                "{} restored bytes do not fit a {}-byte buffer",
                bytes.len(),
                dst.len()
            )));
        }
        match dst {
            ProtectedMut::Host(out) => {
                out.copy_from_slice(bytes);
                Ok(())
            }
            ProtectedMut::Device(region) => {
                let gpu = self.dev.gpu();
                super::check_region(gpu, &region)?;
                // SAFETY: the region was checked to lie inside one allocation
                // of this device, and its constructor's contract gives dckpt
                // exclusive use of it; `bytes` outlives the copy, which the
                // synchronize below completes.
                unsafe { cudarc::driver::result::memcpy_htod_async(region.ptr(), bytes, gpu.stream.cu_stream()) }
                    .map_err(cuda_err)?;
                gpu.stream.synchronize().map_err(cuda_err)
            }
        }
    }
}
