! The heat example in Fortran through the dckpt module (src/ffi/dckpt.f90):
! a 2-D Jacobi plate split by rows over the ranks, a halo exchange each
! step, the plate and the step counter protected, a checkpoint every K
! steps; at start, the newest checkpoint (if any) is restored. The
! directory comes from the environment (DCKPT_PERSISTENT or DCKPT_SCRATCH).
!
!   mpifort -O2 src/ffi/dckpt.f90 examples/fortran/heat.f90 -Ltarget/release -ldckpt -o heat-f
!   DCKPT_PERSISTENT=/tmp/ckpt mpirun -np 2 ./heat-f --steps 200 --every 20 [--crash-at 130]
!
! Rank 0 prints a digest of the final plate's bits: a run killed mid-way
! (--crash-at: the last rank stops at that step) and started again prints
! the same digest as a run never interrupted.
program heat
    use, intrinsic :: iso_fortran_env, only: int64, real64, error_unit
    use mpi
    use dckpt
    implicit none
    integer :: ierr, rank, nranks, up, down, i, j, gi, k
    integer :: rows, cols, every, steps, crash_at
    real(real64), allocatable, target :: u(:, :), v(:, :)
    integer(c_int64_t), target :: step
    integer(c_int64_t) :: latest
    integer(int64) :: mine, digest
    integer(int64), allocatable :: all(:)
    type(c_ptr) :: ck
    integer :: provided
    logical :: halt

    ! MPI_THREAD_MULTIPLE lets dckpt run its collective step behind the
    ! application (with less, it runs in the checkpoint call).
    call MPI_Init_thread(MPI_THREAD_MULTIPLE, provided, ierr)
    call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
    call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
    steps = arg("--steps", 200); every = arg("--every", 20)
    rows = arg("--rows", 64); cols = arg("--cols", 256); crash_at = arg("--crash-at", -1)

    ! Column j of u is a row of the plate (contiguous); 0 and rows+1 are halos.
    allocate (u(cols, 0:rows + 1), v(cols, 0:rows + 1))
    u = 0; v = 0
    do i = 1, rows
        gi = rank*rows + i - 1
        do j = 1, cols
            if (gi == 0) then
                u(j, i) = 1
            else
                u(j, i) = real(mod(gi*31 + (j - 1)*17, 100), real64)/100
            end if
        end do
    end do
    step = 0

    call check(dckpt_init(MPI_COMM_WORLD, "", ck), "dckpt_init")
    call check(dckpt_protect(ck, 0, c_loc(u(1, 1)), int(rows, c_size_t)*int(cols, c_size_t)*8, DCKPT_HOST), "protect plate")
    call check(dckpt_protect(ck, 1, c_loc(step), int(8, c_size_t), DCKPT_HOST), "protect step")
    ! The newest version every rank restores (older ones where it is damaged); 0: none.
    call check(dckpt_restart_latest(ck, "heat-f", latest), "dckpt_restart_latest")
    if (latest > 0 .and. rank == 0) print '(a, i0)', "heat-f: restarted from the checkpoint of step ", step

    up = merge(rank - 1, MPI_PROC_NULL, rank > 0)
    down = merge(rank + 1, MPI_PROC_NULL, rank + 1 < nranks)
    do while (step < steps)
        call MPI_Sendrecv(u(:, 1), cols, MPI_DOUBLE_PRECISION, up, 0, u(:, rows + 1), cols, MPI_DOUBLE_PRECISION, &
                          down, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
        call MPI_Sendrecv(u(:, rows), cols, MPI_DOUBLE_PRECISION, down, 1, u(:, 0), cols, MPI_DOUBLE_PRECISION, &
                          up, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
        do i = 1, rows
            gi = rank*rows + i - 1
            do j = 1, cols
                if (gi == 0 .or. gi == nranks*rows - 1 .or. j == 1 .or. j == cols) then
                    v(j, i) = u(j, i)
                else
                    v(j, i) = 0.25_real64*(u(j, i - 1) + u(j, i + 1) + u(j - 1, i) + u(j + 1, i))
                end if
            end do
        end do
        u(:, 1:rows) = v(:, 1:rows) ! the region stays where it is
        step = step + 1
        if (mod(step, int(every, c_int64_t)) == 0) call check(dckpt_checkpoint(ck, "heat-f", step), "dckpt_checkpoint")
        if (step == crash_at .and. rank == nranks - 1) then
            write (error_unit, '(a, i0, a, i0)') "heat-f: rank ", rank, " dies at step ", step
            call MPI_Abort(MPI_COMM_WORLD, 9, ierr)
        end if
        ! The scheduler's signal, or the walltime nearly spent (every rank agrees):
        ! a last checkpoint, durable, then stop; the same command goes on from it.
        call check(dckpt_should_exit(ck, halt), "dckpt_should_exit")
        if (halt .and. step < steps) then
            if (mod(step, int(every, c_int64_t)) /= 0) call check(dckpt_checkpoint(ck, "heat-f", step), "dckpt_checkpoint")
            call check(dckpt_wait(ck, "heat-f", step), "dckpt_wait")
            if (rank == 0) print '(a, i0, a)', "heat-f: stopping after step ", step, ", its checkpoint durable"
            call check(dckpt_finalize(ck), "dckpt_finalize")
            call MPI_Finalize(ierr)
            stop
        end if
    end do
    call check(dckpt_finalize(ck), "dckpt_finalize")

    ! The plate's bits, each word rotated by its position, folded with XOR.
    mine = 0
    k = 0
    do i = 1, rows
        do j = 1, cols
            mine = ieor(mine, ishftc(transfer(u(j, i), 0_int64), mod(k, 63) + 1))
            k = k + 1
        end do
    end do
    allocate (all(nranks))
    call MPI_Gather(mine, 1, MPI_INTEGER8, all, 1, MPI_INTEGER8, 0, MPI_COMM_WORLD, ierr)
    if (rank == 0) then
        digest = 0
        do i = 1, nranks
            digest = ieor(digest, ishftc(all(i), i))
        end do
        print '(a, i0, a, i0, a, z16.16)', "heat-f: ", nranks, " ranks, ", steps, " steps, plate digest ", digest
    end if
    call MPI_Finalize(ierr)

contains

    integer function arg(name, default)
        character(len=*), intent(in) :: name
        integer, intent(in) :: default
        character(len=64) :: a, b
        integer :: n
        arg = default
        do n = 1, command_argument_count() - 1
            call get_command_argument(n, a)
            if (trim(a) == name) then
                call get_command_argument(n + 1, b)
                read (b, *) arg
            end if
        end do
    end function

    subroutine check(code, what)
        integer(c_int), intent(in) :: code
        character(len=*), intent(in) :: what
        integer :: e
        if (code /= DCKPT_OK) then
            write (error_unit, '(a, a, a, i0, a, a)') "heat-f: ", what, " failed (code ", code, "): ", dckpt_error_message()
            call MPI_Abort(MPI_COMM_WORLD, 1, e)
        end if
    end subroutine
end program heat
