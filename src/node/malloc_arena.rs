//! One malloc arena for the daemon.
//!
//! glibc gives each thread that allocates its own arena, and memory freed in an
//! arena is reused by that arena only. The watch thread decodes every list into
//! memory that it then frees, and the syncing thread builds the cold sync's
//! transaction in another arena: through a real API server holding 10k
//! Services × 10, the daemon's peak RSS was 92 MiB with glibc's arenas and
//! 83 MiB with one (`integration/k8s/bench.sh --sizes 10000 --runs 1`, one run
//! each). The daemon's threads seldom allocate at the same moment, so sharing
//! one costs no time that the bench shows.
//!
//! `mallopt` would take `unsafe`, and glibc reads its tunables once, before
//! `main`. So `kube-nft run` executes itself again, once, at start, with
//! `glibc.malloc.arena_max=1` added to `GLIBC_TUNABLES`, unless they already
//! name an `arena_max`: an operator's own setting wins. C libraries other than
//! glibc ignore the variable.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;

const VARIABLE: &str = "GLIBC_TUNABLES";
const ARENA_MAX: &str = "glibc.malloc.arena_max";

/// The `GLIBC_TUNABLES` to run with, given the current one; `None` when it
/// already names an arena count.
fn with_one_arena(current: Option<&str>) -> Option<String> {
    match current.filter(|t| !t.is_empty()) {
        Some(t)
            if t.split(':')
                .any(|kv| kv.split('=').next() == Some(ARENA_MAX)) =>
        {
            None
        }
        Some(t) => Some(format!("{t}:{ARENA_MAX}=1")),
        None => Some(format!("{ARENA_MAX}=1")),
    }
}

/// Replaces this process by the same program with the same arguments and one
/// malloc arena. Returns when there is nothing to do, or with the reason the
/// program could not be executed again (the process then goes on as it is).
pub fn reexec_with_one_arena() -> Option<std::io::Error> {
    let current = std::env::var(VARIABLE).ok();
    let tunables = with_one_arena(current.as_deref())?;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| OsString::from("kube-nft"));
    // The program's path, not /proc/self/exe: the kernel names the process
    // after the file it executes, and `ps` and `top` would show "exe".
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return Some(e),
    };
    Some(
        std::process::Command::new(program)
            .arg0(arg0)
            .args(args)
            .env(VARIABLE, tunables)
            .exec(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_arena_is_added_to_the_tunables_unless_they_name_a_count() {
        assert_eq!(
            with_one_arena(None).as_deref(),
            Some("glibc.malloc.arena_max=1")
        );
        assert_eq!(
            with_one_arena(Some("")).as_deref(),
            Some("glibc.malloc.arena_max=1")
        );
        assert_eq!(
            with_one_arena(Some("glibc.malloc.tcache_count=0")).as_deref(),
            Some("glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1")
        );
        assert_eq!(with_one_arena(Some("glibc.malloc.arena_max=4")), None);
        assert_eq!(
            with_one_arena(Some(
                "glibc.malloc.mmap_threshold=1:glibc.malloc.arena_max=2"
            )),
            None
        );
        // A name that only starts like it is another tunable.
        assert!(with_one_arena(Some("glibc.malloc.arena_max_x=2")).is_some());
    }
}
