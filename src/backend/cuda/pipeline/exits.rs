//! The ways a prepared version leaves the device: into pinned memory, into
//! the host cache's buffers, into the GPU cache tier's arena, or described
//! for the collective step.

use super::*;

impl GpuDedup {
    /// Computes checkpoint `version` of `input` (a baseline ignores history).
    /// The state changes become permanent with [`GpuDedup::commit`] and are
    /// undone by [`GpuDedup::rollback`].
    pub fn checkpoint(&mut self, version: u64, input: Protected<'_>, baseline: bool) -> Result<GpuCheckpoint> {
        let c = self.compute(version, input, baseline)?;
        self.decoded(c)
    }

    /// The checkpoint whose file [`GpuDedup::compute`] left in pinned memory.
    pub(super) fn decoded(&self, c: Computed) -> Result<GpuCheckpoint> {
        let host = &self.pinned_host()?[..c.prefix_len];
        let data_end = c.data_start + c.data_len;
        let (_, diff, _) =
            decode_body(&host[..data_end]).map_err(|e| Error::Gpu(format!("the GPU produced an invalid diff: {e}")))?;
        let trailer = trailer_of(&host[..c.data_start], &host[data_end..]);
        Ok(GpuCheckpoint {
            diff,
            timings: c.timings,
            d2h_bytes: c.prefix_len as u64,
            data_start: c.data_start,
            file_len: c.prefix_len + 32,
            trailer,
        })
    }

    /// The file of checkpoint `cp` up to its trailer, in pinned memory (the
    /// last computation's; a later one overwrites it).
    pub fn file_prefix(&self, cp: &GpuCheckpoint) -> Result<&[u8]> {
        self.pinned_prefix(cp.file_len)
    }

    /// The last computed file of `file_len` bytes, up to its trailer.
    pub fn pinned_prefix(&self, file_len: usize) -> Result<&[u8]> {
        let host = self.pinned_host()?;
        host.get(..file_len.saturating_sub(32)).ok_or_else(|| Error::Internal("GPU file prefix".into()))
    }

    /// The whole file of checkpoint `cp` as a vector (a copy).
    pub fn file_vec(&self, cp: &GpuCheckpoint) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(cp.file_len);
        v.extend_from_slice(self.file_prefix(cp)?);
        v.extend_from_slice(&cp.trailer);
        Ok(v)
    }

    /// Makes the pinned buffer hold at least `len` bytes (growing by half
    /// again, at most to the largest possible file).
    pub(super) fn ensure_pinned(&mut self, len: usize) -> Result<()> {
        let cap = self.pinned.as_ref().map_or(0, PinnedHostSlice::len);
        if cap >= len {
            return Ok(());
        }
        let want = len.max(cap + cap / 2).min(self.max_body.max(len));
        self.pinned = None; // free before allocating the larger one
        self.pinned = Some(super::super::driver::pinned_zeroed::<u8>(&self.gpu.ctx, want)?);
        Ok(())
    }

    pub(super) fn pinned_host(&self) -> Result<&[u8]> {
        match &self.pinned {
            Some(p) => p.as_slice().map_err(cuda_err),
            None => Ok(&[]),
        }
    }

    /// Copies a prepared version's file to the host (into the pinned
    /// buffer, or into `dest`'s buffers, which must hold at least its
    /// prefix; what follows it is zeroed) and waits for the device.
    pub(crate) fn finish(&mut self, p: Prepared, dest: Dest<'_, '_>) -> Result<Computed> {
        let st = self.gpu.stream.clone();
        let copied = match dest {
            Dest::Pinned => {
                self.ensure_pinned(p.prefix_len)?;
                let host = match &mut self.pinned {
                    Some(pinned) => pinned.as_mut_slice().map_err(cuda_err)?,
                    None => return Err(Error::Internal("pinned buffer".into())),
                };
                emit(&st, &p.pieces, &mut [&mut host[..p.prefix_len]])
            }
            Dest::Buffers(bufs) => emit(&st, &p.pieces, bufs),
        };
        if let Err(e) = copied {
            // Copies already queued must end before the buffers go back.
            let _ = st.synchronize();
            return Err(e);
        }
        let e3 = st.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err)?;
        st.synchronize().map_err(cuda_err)?;
        let [e0, e1, e2] = &p.events;
        Ok(Computed {
            prefix_len: p.prefix_len,
            data_start: p.data_start,
            data_len: p.data_len,
            timings: timings(e0, e1, e2, &e3)?,
        })
    }

    /// [`GpuDedup::finish`] into host buffers without waiting for the copy,
    /// when the file lies in dckpt's own device memory (the output buffer):
    /// waits for the kernels (the input may change once this returns),
    /// starts the D2H and returns the wait for it, which must run before the
    /// buffers are read or reused (the stream's next launches follow the
    /// copy). A file that reads the input (a version stored whole) is copied
    /// before this returns (`None`).
    pub(crate) fn finish_async(
        &mut self,
        p: Prepared,
        bufs: &mut [&mut [u8]],
    ) -> Result<(Computed, Option<crate::backend::Ready>)> {
        let out = DevAddr::of(&self.out, &self.gpu.stream);
        if p.pieces.iter().any(|piece| !matches!(piece, Piece::Device(at, _) if *at == out)) {
            return Ok((self.finish(p, Dest::Buffers(bufs))?, None));
        }
        let st = self.gpu.stream.clone();
        let [e0, e1, e2] = &p.events;
        e2.synchronize().map_err(cuda_err)?;
        let started = emit(&st, &p.pieces, bufs).and_then(|()| {
            st.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC)).map_err(cuda_err)
        });
        let done = match started {
            Ok(done) => done,
            Err(e) => {
                // Nothing may still write into buffers the caller takes back.
                let _ = st.synchronize();
                return Err(e);
            }
        };
        let computed = Computed {
            prefix_len: p.prefix_len,
            data_start: p.data_start,
            data_len: p.data_len,
            // The D2H overlaps the application: not part of the call.
            timings: timings(e0, e1, e2, e2)?,
        };
        Ok((computed, Some(Box::new(move || done.synchronize().map_err(cuda_err)))))
    }

    /// Moves a prepared file into the GPU cache tier's arena (one
    /// device-to-device copy, in the stream's order after the kernels) once
    /// the kernels are done, so that the application's buffer may change
    /// again and the next version may reuse the output buffer at once; its
    /// copy to the host is then [`Staged::copy_out`], on the arena's own
    /// stream. Gives `p` back where there is no arena, no room in it, or the
    /// file is not all in the output buffer (a version stored whole).
    pub(crate) fn stage(&mut self, p: Prepared) -> Result<std::result::Result<(Computed, Staged), Prepared>> {
        let out = DevAddr::of(&self.out, &self.gpu.stream);
        let (Some(cache), [Piece::Device(at, len)]) = (&self.cache, p.pieces.as_slice()) else { return Ok(Err(p)) };
        if *at != out || *len as u64 > cache.capacity() {
            return Ok(Err(p));
        }
        let [e0, e1, e2] = &p.events;
        e2.synchronize().map_err(cuda_err)?;
        let Some(staged) = cache.stage(&self.gpu.stream, out, *len)? else { return Ok(Err(p)) };
        let computed = Computed {
            prefix_len: p.prefix_len,
            data_start: p.data_start,
            data_len: p.data_len,
            // The device copy runs after the call returns; the copy to the host overlaps the application.
            timings: timings(e0, e1, e2, e2)?,
        };
        Ok(Ok((computed, staged)))
    }

    /// The diff a prepared file describes, decoded from its metadata
    /// (header, tables, bitmap: `data_start` bytes, small beside the data),
    /// which is copied to the host where the device wrote it; the data
    /// stays where it is.
    pub(crate) fn describe(&self, p: &Prepared) -> Result<Diff> {
        let copied;
        let meta = match p.pieces.first() {
            Some(Piece::Host(meta)) => meta.as_slice(),
            Some(&Piece::Device(at, _)) if at == DevAddr::of(&self.out, &self.gpu.stream) => {
                let st = &self.gpu.stream;
                let mut meta = vec![0u8; p.data_start];
                st.memcpy_dtoh(&self.out.slice(0..p.data_start), &mut meta).map_err(cuda_err)?;
                st.synchronize().map_err(cuda_err)?;
                copied = meta;
                copied.as_slice()
            }
            Some(_) => return Err(Error::Internal("a prepared file of an unknown shape".into())),
            None => return Err(Error::Internal("a prepared file without pieces".into())),
        };
        crate::format::decode_meta_folded(meta, p.data_len as u64)
            .map_err(|e| Error::Gpu(format!("the GPU produced an invalid diff: {e}")))
    }

    /// The device address of a prepared file's FIRST data (concatenated in
    /// run order): in the output buffer, or the input itself for a version
    /// stored whole. Valid until the next version is prepared.
    pub(crate) fn first_data_addr(&self, p: &Prepared) -> Result<DevAddr> {
        match p.pieces.as_slice() {
            [Piece::Device(at, _)] => at.add(p.data_start as u64),
            [Piece::Host(_), Piece::Device(src, _), Piece::Device(..)] => Ok(*src),
            _ => Err(Error::Internal("a prepared file of an unknown shape".into())),
        }
    }

    /// Device-side times of a prepared file's computation (waits for its
    /// kernels; the copy out is not part of them).
    pub(crate) fn prepared_timings(&self, p: &Prepared) -> Result<GpuTimings> {
        let [e0, e1, e2] = &p.events;
        e2.synchronize().map_err(cuda_err)?;
        timings(e0, e1, e2, e2)
    }

    /// A prepared version's file copied to the pinned buffer, with its
    /// trailer (what the synchronous path writes; the diff it describes is
    /// already known, [`GpuDedup::describe`]).
    pub(crate) fn finish_pinned(&mut self, p: Prepared) -> Result<(Computed, [u8; 32])> {
        let c = self.finish(p, Dest::Pinned)?;
        let host = &self.pinned_host()?[..c.prefix_len];
        let data_end = c.data_start + c.data_len;
        Ok((c, trailer_of(&host[..c.data_start], &host[data_end..])))
    }
}

/// Copies `pieces` into the consecutive buffers `bufs` on `st` (device
/// pieces asynchronously: the caller synchronizes before reading `bufs`);
/// zeroes what the pieces leave of `bufs`.
#[allow(unsafe_code)] // raw copies; their SAFETY below
pub(super) fn emit(st: &Arc<cudarc::driver::CudaStream>, pieces: &[Piece], bufs: &mut [&mut [u8]]) -> Result<()> {
    let (mut b, mut at) = (0usize, 0usize);
    for piece in pieces {
        let len = match piece {
            Piece::Host(v) => v.len(),
            Piece::Device(_, len) => *len,
        };
        let mut done = 0;
        while done < len {
            let buf =
                bufs.get_mut(b).ok_or_else(|| Error::Internal("the host buffers are shorter than the file".into()))?;
            let n = (len - done).min(buf.len() - at);
            let dst = &mut buf[at..at + n];
            match piece {
                Piece::Host(v) => dst.copy_from_slice(&v[done..done + n]),
                // SAFETY: `ptr + done .. ptr + done + n` lies in a device
                // span that stays valid until the stream is synchronized
                // (Piece's contract); `dst` is host memory borrowed for
                // longer than that, and the caller synchronizes the stream
                // before anything reads it.
                Piece::Device(ptr, _) => {
                    unsafe { super::super::driver::copy_dtoh_async(dst, ptr.add(done as u64)?, st) }?
                }
            }
            done += n;
            at += n;
            if at == buf.len() {
                (b, at) = (b + 1, 0);
            }
        }
    }
    for (i, buf) in bufs.iter_mut().enumerate().skip(b) {
        let from = if i == b { at } else { 0 };
        buf[from..].fill(0);
    }
    Ok(())
}
