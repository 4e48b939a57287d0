//! The heat example's plate in device memory: the Jacobi sweep is a CUDA
//! kernel compiled at start by NVRTC (`--fmad=false`, the same sums in the
//! same order as the CPU loop, so both give the same plate bit for bit),
//! the halo rows cross the bus once per step (the MPI exchange runs on the
//! host), and the runtime checkpoints and restores the plate where it lives.

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use std::sync::Arc;

/// One sweep over rows `1..=rows`, columns `1..cols - 1`, into `next`.
const JACOBI: &str = r#"
extern "C" __global__ void jacobi(const double* plate, double* next, unsigned long long rows,
                                  unsigned long long cols) {
    unsigned long long inner = cols - 2;
    for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < rows * inner;
         k += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long at = (k / inner + 1) * cols + k % inner + 1;
        next[at] = 0.25 * (plate[at - cols] + plate[at + cols] + plate[at - 1] + plate[at + 1]);
    }
}
"#;

fn gpu_err(e: impl std::fmt::Display) -> dckpt::Error {
    dckpt::Error::Gpu(e.to_string())
}

/// A rank's plate (`rows` real rows and a ghost row above and below, `cols`
/// wide) and the buffer a sweep writes, on one GPU.
pub struct DevicePlate {
    stream: Arc<CudaStream>,
    jacobi: CudaFunction,
    plate: CudaSlice<f64>,
    next: CudaSlice<f64>,
    rows: usize,
    cols: usize,
}

impl DevicePlate {
    /// A zeroed plate on GPU `ordinal`.
    pub fn new(ordinal: usize, rows: usize, cols: usize) -> dckpt::Result<Self> {
        let ctx = CudaContext::new(ordinal).map_err(gpu_err)?;
        let (major, minor) = ctx.compute_capability().map_err(gpu_err)?;
        let opts = CompileOptions {
            fmad: Some(false),
            options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(JACOBI, opts).map_err(gpu_err)?;
        let jacobi = ctx.load_module(ptx).map_err(gpu_err)?.load_function("jacobi").map_err(gpu_err)?;
        let stream = ctx.new_stream().map_err(gpu_err)?;
        let plate = stream.alloc_zeros::<f64>((rows + 2) * cols).map_err(gpu_err)?;
        let next = stream.alloc_zeros::<f64>((rows + 2) * cols).map_err(gpu_err)?;
        stream.synchronize().map_err(gpu_err)?;
        Ok(DevicePlate { stream, jacobi, plate, next, rows, cols })
    }

    /// The plate's device address and length in bytes (what the runtime protects).
    pub fn region(&self) -> (u64, usize) {
        let (ptr, _sync) = self.plate.device_ptr(&self.stream);
        (ptr, self.plate.len() * 8)
    }

    /// The first and the last real row, on the host.
    pub fn edge_rows(&self) -> dckpt::Result<(Vec<f64>, Vec<f64>)> {
        let (rows, cols) = (self.rows, self.cols);
        let mut first = vec![0f64; cols];
        let mut last = vec![0f64; cols];
        self.stream.memcpy_dtoh(&self.plate.slice(cols..2 * cols), &mut first).map_err(gpu_err)?;
        self.stream.memcpy_dtoh(&self.plate.slice(rows * cols..(rows + 1) * cols), &mut last).map_err(gpu_err)?;
        Ok((first, last))
    }

    /// Writes `values` into the plate from row `row` on (ghost rows are 0 and `rows + 1`).
    pub fn set_rows(&mut self, row: usize, values: &[f64]) -> dckpt::Result<()> {
        let at = row * self.cols;
        self.stream.memcpy_htod(values, &mut self.plate.slice_mut(at..at + values.len())).map_err(gpu_err)
    }

    /// One Jacobi sweep over the real rows, copied back into the plate
    /// (the side columns stay as they are: zero in both buffers).
    pub fn sweep(&mut self) -> dckpt::Result<()> {
        let (rows, cols) = (self.rows as u64, self.cols as u64);
        let cfg = LaunchConfig { grid_dim: (1024, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut b = self.stream.launch_builder(&self.jacobi);
        b.arg(&self.plate).arg(&mut self.next).arg(&rows).arg(&cols);
        // SAFETY: the arguments match `jacobi`'s signature; both buffers hold
        // (rows + 2) * cols doubles, and the kernel reads rows 0..=rows + 1
        // and writes rows 1..=rows of them, columns 1..cols - 1.
        unsafe { b.launch(cfg) }.map_err(gpu_err)?;
        let real = self.cols..(self.rows + 1) * self.cols;
        self.stream.memcpy_dtod(&self.next.slice(real.clone()), &mut self.plate.slice_mut(real)).map_err(gpu_err)
    }

    /// Waits for every queued sweep and copy (before the runtime reads or
    /// writes the plate).
    pub fn synchronize(&self) -> dckpt::Result<()> {
        self.stream.synchronize().map_err(gpu_err)
    }

    /// The real rows, on the host.
    pub fn real_rows(&self) -> dckpt::Result<Vec<f64>> {
        let mut out = vec![0f64; self.rows * self.cols];
        self.stream
            .memcpy_dtoh(&self.plate.slice(self.cols..(self.rows + 1) * self.cols), &mut out)
            .map_err(gpu_err)?;
        Ok(out)
    }
}
