//! The CPU the calling thread runs on, where the kernel tells it for the price of a load.
//!
//! Linux (4.18+) keeps a restartable-sequences area per registered thread and writes the thread's
//! current CPU into it whenever the thread is scheduled onto another one. glibc (2.35+) registers
//! that area for every thread it starts and exports where it sits: `__rseq_offset` bytes from the
//! thread pointer, `__rseq_size` bytes long (0 when registration is off, by a tunable or because
//! the kernel refused it). Reading the CPU is then two loads, about a quarter of a nanosecond here,
//! against about 1.7 ns for `sched_getcpu()` and a syscall without the vDSO.
//!
//! The area's layout (the kernel's `struct rseq`, 32-byte aligned):
//!
//! | offset | field           | use here                                       |
//! |--------|-----------------|------------------------------------------------|
//! | 0      | `cpu_id_start`  | not read                                       |
//! | 4      | `cpu_id`        | the current CPU; `u32::MAX - 1`, `u32::MAX` when not registered |
//! | 8..    | the rest        | not read                                       |
//!
//! Everywhere else (other OSes, other libcs, Miri, registration off) [`current_cpu`] answers
//! `None` and the caller falls back to a per-thread number. The answer is a hint: the thread can be
//! moved to another CPU right after reading it, so nothing may depend on it for correctness (the
//! sharded limiter uses it only to pick which shard to try first).
#![allow(unsafe_code)]

use core::sync::atomic::{AtomicIsize, AtomicU32, Ordering};

/// Not looked up yet.
const UNKNOWN: isize = isize::MIN;
/// Looked up: no registered area to read.
const ABSENT: isize = isize::MIN + 1;
/// The offset of `cpu_id` in the kernel's `struct rseq`.
const CPU_ID_OFFSET: isize = 4;
/// The smallest `__rseq_size` that covers `cpu_id` (the original ABI's 20 bytes, and up).
const MIN_AREA: u32 = 20;

/// `__rseq_offset`, or [`ABSENT`], or [`UNKNOWN`] before the first call.
static OFFSET: AtomicIsize = AtomicIsize::new(UNKNOWN);

/// The calling thread's current CPU, when the kernel publishes it in a registered rseq area.
#[inline]
pub(crate) fn current_cpu() -> Option<usize> {
    // Relaxed: the value is computed identically by any thread that races to fill it in, and is
    // read only for itself.
    let mut offset = OFFSET.load(Ordering::Relaxed);
    if offset == UNKNOWN {
        offset = look_up();
    }
    if offset == ABSENT {
        return None;
    }
    let tp = thread_pointer();
    // SAFETY: glibc exports `__rseq_offset` as the offset from the thread pointer to this thread's
    // rseq area, which is part of its thread control block and lives as long as the thread, and
    // `__rseq_size >= 20` (checked in `look_up`) says the area covers `cpu_id` at offset 4. The
    // area is 32-byte aligned, so the `u32` is aligned. The kernel writes it while the thread is
    // off the CPU, hence an atomic (not a plain) read.
    let cpu = unsafe {
        &*tp.wrapping_offset(offset + CPU_ID_OFFSET)
            .cast::<AtomicU32>()
    }
    // Relaxed: one location, read as a hint; no other memory depends on it.
    .load(Ordering::Relaxed);
    // `RSEQ_CPU_ID_UNINITIALIZED` (-1) and `RSEQ_CPU_ID_REGISTRATION_FAILED` (-2): not registered.
    (cpu < u32::MAX - 1).then_some(cpu as usize)
}

/// Finds glibc's rseq exports, once per process (racing first calls all get the same answer).
#[cold]
#[inline(never)]
fn look_up() -> isize {
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only searches the loaded
    // objects' symbol tables; it returns null when the symbol is missing (glibc before 2.35, or a
    // static binary), which is checked before anything is read.
    let (size, offset) = unsafe {
        (
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr()).cast::<u32>(),
            libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr()).cast::<isize>(),
        )
    };
    let found = if size.is_null() || offset.is_null() {
        ABSENT
    } else {
        // SAFETY: both symbols are glibc's `const unsigned int __rseq_size` and
        // `const ptrdiff_t __rseq_offset`, set before `main` and never written after; the
        // pointers are non-null and point at them, suitably aligned for their types.
        let (size, offset) = unsafe { (size.read(), offset.read()) };
        if size >= MIN_AREA { offset } else { ABSENT }
    };
    // Relaxed: see `current_cpu`.
    OFFSET.store(found, Ordering::Relaxed);
    found
}

/// The thread pointer: what TLS offsets, `__rseq_offset` among them, are relative to.
#[inline(always)]
fn thread_pointer() -> *const u8 {
    let tp: *const u8;
    // SAFETY: on x86-64 the word at `fs:0` is the thread control block's pointer to itself (the
    // TLS ABI guarantees it), so the load reads mapped memory and changes nothing else.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        core::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags));
    }
    // SAFETY: `tpidr_el0` holds the thread pointer on AArch64 Linux; reading it has no effects.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        core::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags));
    }
    tp
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned to each CPU it may use in turn, the thread reads that CPU back (where the area is
    /// registered; elsewhere it must answer `None` every time, never a wrong CPU).
    #[test]
    fn follows_the_thread_across_cpus() {
        std::thread::spawn(|| {
            // SAFETY: `cpu_set_t` is plain data; all zeroes is the empty set.
            let mut allowed: libc::cpu_set_t = unsafe { core::mem::zeroed() };
            let size = core::mem::size_of::<libc::cpu_set_t>();
            // SAFETY: `allowed` is a valid, writable `cpu_set_t` of `size` bytes.
            assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut allowed) }, 0);
            let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                // SAFETY: `cpu` is below `CPU_SETSIZE`, the set's capacity.
                .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &allowed) })
                .collect();
            let registered = current_cpu().is_some();
            for &cpu in &cpus {
                // SAFETY: as above, all zeroes is the empty set.
                let mut one: libc::cpu_set_t = unsafe { core::mem::zeroed() };
                // SAFETY: `cpu` is below `CPU_SETSIZE`, the set's capacity.
                unsafe { libc::CPU_SET(cpu, &mut one) };
                // SAFETY: `one` is a valid `cpu_set_t` of `size` bytes; 0 is this thread.
                assert_eq!(unsafe { libc::sched_setaffinity(0, size, &one) }, 0);
                // `sched_setaffinity` moves the thread before it returns.
                let read = current_cpu();
                if registered {
                    assert_eq!(read, Some(cpu), "pinned to CPU {cpu}");
                } else {
                    assert_eq!(read, None);
                }
            }
            eprintln!(
                "rseq area registered: {registered}; checked on CPUs {cpus:?} (glibc's \
                 sched_getcpu says {})",
                // SAFETY: no preconditions.
                unsafe { libc::sched_getcpu() }
            );
        })
        .join()
        .unwrap();
    }
}
