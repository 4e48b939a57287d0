! dckpt for Fortran: the C ABI (src/ffi/dckpt.h) through iso_c_binding.
!
!   use dckpt
!   type(c_ptr) :: ck
!   ierr = dckpt_init(MPI_COMM_WORLD, "", ck)            ! "" = defaults + DCKPT_<KEY> environment
!   ierr = dckpt_protect(ck, 0, c_loc(u), int(size(u), c_size_t) * 8, DCKPT_HOST)
!   ierr = dckpt_checkpoint(ck, "heat", step)
!   ierr = dckpt_restart_latest(ck, "heat", version)     ! 0: none, start fresh
!   (or dckpt_latest + dckpt_restart for one chosen version)
!   ierr = dckpt_finalize(ck)
!
! Every function returns DCKPT_OK (0) or an error code; dckpt_error_message()
! gives the last message. init, checkpoint, latest, restart, wait and
! finalize are collective: every rank calls them, in the same order. With
! mpi_f08, pass comm%MPI_VAL. Protected arrays must have the TARGET attribute
! and stay allocated while they are protected. Compile this file with the
! program (mpifort src/ffi/dckpt.f90 prog.f90 -Ltarget/release -ldckpt).
module dckpt
    use, intrinsic :: iso_c_binding
    implicit none
    private
    public :: dckpt_init, dckpt_protect, dckpt_unprotect, dckpt_checkpoint, dckpt_latest, dckpt_restart, &
              dckpt_restart_latest, dckpt_versions, dckpt_wait, dckpt_should_exit, dckpt_finalize, &
              dckpt_error_message, dckpt_old_regions, dckpt_read_region, dckpt_old_region, dckpt_config
    public :: DCKPT_OK, DCKPT_HOST, DCKPT_DEVICE, DCKPT_ERR_IO, DCKPT_ERR_CORRUPT, DCKPT_ERR_MISSING_VERSION, &
              DCKPT_ERR_NO_STORE, DCKPT_ERR_MISMATCH, DCKPT_ERR_VERSION_NOT_NEWER, DCKPT_ERR_INVALID_OPTION, &
              DCKPT_ERR_GPU, DCKPT_ERR_COLLECTIVE, DCKPT_ERR_OWNER_UNAVAILABLE, DCKPT_ERR_BROKEN_REFERENCE, &
              DCKPT_ERR_LOCKED, DCKPT_ERR_UNSAFE_PATH, DCKPT_ERR_NEEDS_REPAIR, DCKPT_ERR_NO_SPACE, &
              DCKPT_ERR_NOT_DURABLE, DCKPT_ERR_RANK_COUNT, DCKPT_ERR_SIZE_MISMATCH, DCKPT_ERR_MISSING_REGION, &
              DCKPT_ERR_RESOURCES_EXHAUSTED, DCKPT_ERR_INTERNAL
    ! What a program needs of iso_c_binding to call these (`use dckpt` alone).
    public :: c_ptr, c_null_ptr, c_loc, c_int, c_int64_t, c_size_t, c_double, c_float

    integer(c_int), parameter :: DCKPT_OK = 0, DCKPT_HOST = 0, DCKPT_DEVICE = 1
    ! Every DCKPT_ERR_* of dckpt.h (the error kinds' stable codes, the CLI's E0NN).
    integer(c_int), parameter :: DCKPT_ERR_IO = 1, DCKPT_ERR_CORRUPT = 2, DCKPT_ERR_MISSING_VERSION = 3, &
                                 DCKPT_ERR_NO_STORE = 4, DCKPT_ERR_MISMATCH = 5, DCKPT_ERR_VERSION_NOT_NEWER = 6, &
                                 DCKPT_ERR_INVALID_OPTION = 7, DCKPT_ERR_GPU = 8, DCKPT_ERR_COLLECTIVE = 9, &
                                 DCKPT_ERR_OWNER_UNAVAILABLE = 10, DCKPT_ERR_BROKEN_REFERENCE = 11, &
                                 DCKPT_ERR_LOCKED = 12, DCKPT_ERR_UNSAFE_PATH = 13, DCKPT_ERR_NEEDS_REPAIR = 14, &
                                 DCKPT_ERR_NO_SPACE = 15, DCKPT_ERR_NOT_DURABLE = 16, DCKPT_ERR_RANK_COUNT = 17, &
                                 DCKPT_ERR_SIZE_MISMATCH = 18, DCKPT_ERR_MISSING_REGION = 19, &
                                 DCKPT_ERR_RESOURCES_EXHAUSTED = 20, DCKPT_ERR_INTERNAL = 99

    !> One region of one rank of the job that wrote a checkpoint (dckpt_old_regions).
    type, bind(C) :: dckpt_old_region
        integer(c_int32_t) :: rank   ! the old job's rank
        integer(c_int32_t) :: id     ! the id it protected the region under
        integer(c_int64_t) :: len    ! bytes
        integer(c_int) :: device     ! 1: device memory, 0: host memory
    end type

    !> A step number of either integer kind (default integer or c_int64_t).
    interface dckpt_checkpoint
        module procedure dckpt_checkpoint_i8, dckpt_checkpoint_i4
    end interface
    interface dckpt_restart
        module procedure dckpt_restart_i8, dckpt_restart_i4
    end interface
    interface dckpt_wait
        module procedure dckpt_wait_i8, dckpt_wait_i4
    end interface

    interface
        integer(c_int) function c_old_regions(h, name, regions, capacity, count) bind(C, name="dckpt_old_regions")
            import :: c_int, c_ptr, c_char, c_size_t, dckpt_old_region
            type(c_ptr), value :: h
            character(kind=c_char), dimension(*) :: name
            type(dckpt_old_region), dimension(*) :: regions
            integer(c_size_t), value :: capacity
            integer(c_size_t) :: count
        end function
        integer(c_int) function c_read_region(h, name, rank, id, version, offset, buf, len) &
                bind(C, name="dckpt_read_region")
            import :: c_int, c_ptr, c_char, c_int32_t, c_int64_t, c_size_t
            type(c_ptr), value :: h, buf
            character(kind=c_char), dimension(*) :: name
            integer(c_int32_t), value :: rank, id
            integer(c_int64_t), value :: version, offset
            integer(c_size_t), value :: len
        end function
        integer(c_int) function c_config(setting) bind(C, name="dckpt_config")
            import :: c_int, c_char
            character(kind=c_char), dimension(*) :: setting
        end function
        integer(c_int) function c_init_f(comm, config, out) bind(C, name="dckpt_init_f")
            import :: c_int, c_char, c_ptr
            integer(c_int), value :: comm
            character(kind=c_char), dimension(*) :: config
            type(c_ptr) :: out
        end function
        integer(c_int) function c_init_f_default(comm, config, out) bind(C, name="dckpt_init_f")
            import :: c_int, c_ptr
            integer(c_int), value :: comm
            type(c_ptr), value :: config
            type(c_ptr) :: out
        end function
        integer(c_int) function c_protect(h, id, ptr, len, kind) bind(C, name="dckpt_protect")
            import :: c_int, c_ptr, c_size_t, c_int32_t
            type(c_ptr), value :: h, ptr
            integer(c_int32_t), value :: id
            integer(c_size_t), value :: len
            integer(c_int), value :: kind
        end function
        integer(c_int) function c_unprotect(h, id) bind(C, name="dckpt_unprotect")
            import :: c_int, c_ptr, c_int32_t
            type(c_ptr), value :: h
            integer(c_int32_t), value :: id
        end function
        integer(c_int) function c_checkpoint(h, name, version) bind(C, name="dckpt_checkpoint")
            import :: c_int, c_ptr, c_char, c_int64_t
            type(c_ptr), value :: h
            character(kind=c_char), dimension(*) :: name
            integer(c_int64_t), value :: version
        end function
        integer(c_int) function c_latest(h, name, version) bind(C, name="dckpt_latest")
            import :: c_int, c_ptr, c_char, c_int64_t
            type(c_ptr), value :: h
            character(kind=c_char), dimension(*) :: name
            integer(c_int64_t) :: version
        end function
        integer(c_int) function c_versions(h, name, versions, capacity, count) bind(C, name="dckpt_versions")
            import :: c_int, c_ptr, c_char, c_int64_t, c_size_t
            type(c_ptr), value :: h
            character(kind=c_char), dimension(*) :: name
            integer(c_int64_t), dimension(*) :: versions
            integer(c_size_t), value :: capacity
            integer(c_size_t) :: count
        end function
        integer(c_int) function c_restart_latest(h, name, version) bind(C, name="dckpt_restart_latest")
            import :: c_int, c_ptr, c_char, c_int64_t
            type(c_ptr), value :: h
            character(kind=c_char), dimension(*) :: name
            integer(c_int64_t) :: version
        end function
        integer(c_int) function c_restart(h, name, version) bind(C, name="dckpt_restart")
            import :: c_int, c_ptr, c_char, c_int64_t
            type(c_ptr), value :: h
            character(kind=c_char), dimension(*) :: name
            integer(c_int64_t), value :: version
        end function
        integer(c_int) function c_wait(h, name, version) bind(C, name="dckpt_wait")
            import :: c_int, c_ptr, c_char, c_int64_t
            type(c_ptr), value :: h
            character(kind=c_char), dimension(*) :: name
            integer(c_int64_t), value :: version
        end function
        integer(c_int) function c_should_exit(h, flag) bind(C, name="dckpt_should_exit")
            import :: c_int, c_ptr
            type(c_ptr), value :: h
            integer(c_int), intent(out) :: flag
        end function
        integer(c_int) function c_finalize(h) bind(C, name="dckpt_finalize")
            import :: c_int, c_ptr
            type(c_ptr), value :: h
        end function
        type(c_ptr) function c_last_error() bind(C, name="dckpt_last_error")
            import :: c_ptr
        end function
        integer(c_size_t) function c_strlen(s) bind(C, name="strlen")
            import :: c_size_t, c_ptr
            type(c_ptr), value :: s
        end function
    end interface

contains

    !> `s` without trailing blanks, NUL-terminated.
    pure function c_text(s) result(c)
        character(len=*), intent(in) :: s
        character(kind=c_char, len=len_trim(s) + 1) :: c
        c = trim(s)//c_null_char
    end function

    !> Sets one configuration key for the next dckpt_init, as "key = value" (over the file and
    !> the environment; SCR's SCR_Config). Call it on every rank before dckpt_init.
    integer(c_int) function dckpt_config(setting)
        character(len=*), intent(in) :: setting
        dckpt_config = c_config(c_text(setting))
    end function

    !> A runtime over a duplicate of `comm` (a Fortran communicator; collective),
    !> configured by the TOML file `config` ("" = the defaults), with the
    !> DCKPT_<KEY> environment overrides.
    integer(c_int) function dckpt_init(comm, config, handle)
        integer, intent(in) :: comm
        character(len=*), intent(in) :: config
        type(c_ptr), intent(out) :: handle
        handle = c_null_ptr
        if (len_trim(config) == 0) then
            dckpt_init = c_init_f_default(int(comm, c_int), c_null_ptr, handle)
        else
            dckpt_init = c_init_f(int(comm, c_int), c_text(config), handle)
        end if
    end function

    !> Protects `len` bytes at `ptr` (c_loc of a TARGET array) as region `id`;
    !> `kind` is DCKPT_HOST or DCKPT_DEVICE.
    integer(c_int) function dckpt_protect(handle, id, ptr, len, kind)
        type(c_ptr), intent(in) :: handle, ptr
        integer, intent(in) :: id
        integer(c_size_t), intent(in) :: len
        integer(c_int), intent(in) :: kind
        dckpt_protect = c_protect(handle, int(id, c_int32_t), ptr, len, kind)
    end function

    !> Stops protecting region `id`.
    integer(c_int) function dckpt_unprotect(handle, id)
        type(c_ptr), intent(in) :: handle
        integer, intent(in) :: id
        dckpt_unprotect = c_unprotect(handle, int(id, c_int32_t))
    end function

    !> Checkpoint `version` of `name` (collective).
    integer(c_int) function dckpt_checkpoint_i8(handle, name, version)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        integer(c_int64_t), intent(in) :: version
        dckpt_checkpoint_i8 = c_checkpoint(handle, c_text(name), version)
    end function

    integer(c_int) function dckpt_checkpoint_i4(handle, name, version)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        integer(c_int), intent(in) :: version
        dckpt_checkpoint_i4 = c_checkpoint(handle, c_text(name), int(version, c_int64_t))
    end function

    !> The newest version of `name` every rank can restart from, 0 if none (collective).
    integer(c_int) function dckpt_latest(handle, name, version)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        integer(c_int64_t), intent(out) :: version
        version = 0
        dckpt_latest = c_latest(handle, c_text(name), version)
    end function

    !> The versions of `name` every rank can restart from, oldest first: `count` gets how many
    !> there are, `versions` the first size(versions) of them (collective).
    integer(c_int) function dckpt_versions(handle, name, versions, count)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        integer(c_int64_t), intent(out) :: versions(:)
        integer(c_size_t), intent(out) :: count
        integer(c_int64_t) :: none(1)
        count = 0
        if (size(versions) > 0) then
            dckpt_versions = c_versions(handle, c_text(name), versions, int(size(versions), c_size_t), count)
        else
            dckpt_versions = c_versions(handle, c_text(name), none, 0_c_size_t, count)
        end if
    end function

    !> Restarts from the newest version of `name` that restores on every rank (older ones where
    !> the newest is damaged everywhere); `version` gets it, 0 if there is none (collective).
    integer(c_int) function dckpt_restart_latest(handle, name, version)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        integer(c_int64_t), intent(out) :: version
        version = 0
        dckpt_restart_latest = c_restart_latest(handle, c_text(name), version)
    end function

    !> Restores `version` of `name` into every protected region (collective).
    integer(c_int) function dckpt_restart_i8(handle, name, version)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        integer(c_int64_t), intent(in) :: version
        dckpt_restart_i8 = c_restart(handle, c_text(name), version)
    end function

    integer(c_int) function dckpt_restart_i4(handle, name, version)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        integer(c_int), intent(in) :: version
        dckpt_restart_i4 = c_restart(handle, c_text(name), int(version, c_int64_t))
    end function

    !> Waits until `version` of `name` is durable on every tier of every rank (collective).
    integer(c_int) function dckpt_wait_i8(handle, name, version)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        integer(c_int64_t), intent(in) :: version
        dckpt_wait_i8 = c_wait(handle, c_text(name), version)
    end function

    integer(c_int) function dckpt_wait_i4(handle, name, version)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        integer(c_int), intent(in) :: version
        dckpt_wait_i4 = c_wait(handle, c_text(name), int(version, c_int64_t))
    end function

    !> Whether the job should take a last checkpoint and stop (collective): `stop` is .true. on every
    !> rank once SIGTERM, SIGUSR1 or SIGINT reached any rank, or once the walltime left is shorter than
    !> `halt_seconds` plus what the last checkpoint took to become durable.
    integer(c_int) function dckpt_should_exit(handle, stop)
        type(c_ptr), intent(in) :: handle
        logical, intent(out) :: stop
        integer(c_int) :: flag
        dckpt_should_exit = c_should_exit(handle, flag)
        stop = flag /= 0
    end function

    !> Every region of every rank of the job that wrote `name` (collective): `count` gets how many
    !> there are, `regions` the first size(regions) of them. A job of another rank count reads what
    !> it needs with dckpt_read_region.
    integer(c_int) function dckpt_old_regions(handle, name, regions, count)
        type(c_ptr), intent(in) :: handle
        character(len=*), intent(in) :: name
        type(dckpt_old_region), intent(out) :: regions(:)
        integer(c_size_t), intent(out) :: count
        type(dckpt_old_region) :: none(1)
        count = 0
        if (size(regions) > 0) then
            dckpt_old_regions = c_old_regions(handle, c_text(name), regions, int(size(regions), c_size_t), count)
        else
            dckpt_old_regions = c_old_regions(handle, c_text(name), none, 0_c_size_t, count)
        end if
    end function

    !> Reads `len` bytes from `offset` of region `id` of the old job's rank `rank` at committed
    !> `version` of `name` into `buf` (c_loc of a TARGET array); not collective.
    integer(c_int) function dckpt_read_region(handle, name, rank, id, version, offset, buf, len)
        type(c_ptr), intent(in) :: handle, buf
        character(len=*), intent(in) :: name
        integer, intent(in) :: rank, id
        integer(c_int64_t), intent(in) :: version, offset
        integer(c_size_t), intent(in) :: len
        dckpt_read_region = c_read_region(handle, c_text(name), int(rank, c_int32_t), int(id, c_int32_t), &
                                          version, offset, buf, len)
    end function

    !> Waits for every checkpoint and frees the runtime (collective).
    integer(c_int) function dckpt_finalize(handle)
        type(c_ptr), intent(inout) :: handle
        dckpt_finalize = c_finalize(handle)
        handle = c_null_ptr
    end function

    !> The message of the last error of the calling thread.
    function dckpt_error_message() result(msg)
        character(len=:), allocatable :: msg
        type(c_ptr) :: p
        character(kind=c_char), pointer :: chars(:)
        integer(c_size_t) :: n, i
        p = c_last_error()
        n = c_strlen(p)
        call c_f_pointer(p, chars, [n])
        allocate (character(len=n) :: msg)
        do i = 1, n
            msg(i:i) = chars(i)
        end do
    end function
end module dckpt
