//! The worker thread's loop: passes while users run, with back-off between the ones that find
//! nothing, a last pass when they are gone, and the I/O threads stopped as it exits. Every wait
//! on the server thread's condition variable, and why none loses a wake-up, is in
//! [`thread`](crate::server::thread); this file decides only what to do between them.

use std::time::{Duration, Instant};

use crate::protocol::port::CROWDING;
use crate::server::dispatch::PassCache;
use crate::server::exec;
use crate::server::exec::{yield_to_others, Fate};
use crate::server::stats::bump;
use crate::server::Inner;
use crate::sync::{Arc, Ordering};

/// The silence after which `ServerConfig::absent_park` applies.
pub const ABSENT_AFTER: Duration = Duration::from_secs(1);

/// The ports of one unit of the back-off.
const UNIT_PORTS: usize = 256;

/// Back-to-back passes before the worker starts yielding, and passes before it parks, in units
/// of [`UNIT_PORTS`] scanned since the last work (an idle pass over fewer counts as one). The
/// passes from [`HOT_PASSES`] on (the spin phase) give a spin hint each, and are left out while
/// the worker's yields let other threads run (`PassCache::yield_every`).
/// Under loom it parks at once: loom's timed waits never time out, which bounds the model.
#[cfg(not(loom))]
const BACKOFF_PASSES: (u32, u32) = (64, 64 + 256);
#[cfg(loom)]
const BACKOFF_PASSES: (u32, u32) = (0, 0);
/// Idle passes right after a served one that poll again at once, without a spin hint; none
/// while the worker takes turns with the thread its yields run ([`takes_turns`]).
#[cfg(not(loom))]
const HOT_PASSES: u32 = 32;
#[cfg(loom)]
const HOT_PASSES: u32 = 0;

/// The worker's timer slack (how late the kernel may end a timed park, to batch wake-ups).
/// Tight (1 µs) while parks are short, so that a park right after traffic lasts about what it
/// asks for, not the default 50 µs more; the thread's default for the longest parks, where the
/// number of wake-ups is the CPU cost and a late one costs little: a 250 µs park may then end
/// up to 50 µs late, as LLVM's 250 µs `nanosleep` may, for about a sixth fewer wake-ups.
/// Changed only when that choice changes (twice per silence). Not under loom or miri (no
/// foreign calls there; their timers have no slack).
struct TimerSlack {
    tight: bool,
}

impl TimerSlack {
    fn tight() -> Self {
        let mut slack = TimerSlack { tight: false };
        slack.set(true);
        slack
    }

    fn set(&mut self, tight: bool) {
        if self.tight == tight {
            return;
        }
        self.tight = tight;
        #[cfg(all(target_os = "linux", not(loom), not(miri)))]
        // SAFETY: PR_SET_TIMERSLACK takes one integer argument (nanoseconds; 0 restores the
        // thread's default) and affects only this thread.
        unsafe {
            libc::prctl(
                libc::PR_SET_TIMERSLACK,
                if tight { 1000 } else { 0 } as libc::c_ulong,
            );
        }
    }
}

/// The worker thread's body, spawned by `ServerThread::start`.
pub(crate) fn run(inner: Arc<Inner>) {
    let this = &inner.thread;
    let mut cache = PassCache::new();
    let park = Parks {
        most: inner.context.config.park,
        absent: inner.context.config.absent_park,
    };
    let mut seen_epoch = 0;
    exec::keep_large_received();
    loop {
        // Nothing to serve until a user comes: a kept `recv_n`'s buffers would wait unused.
        exec::release_large();
        // Asleep while nobody could send a request (see `thread`'s module docs).
        let running = this.wait_for_users(&inner.context.stats, &mut seen_epoch);
        // Everything the worker calls (plugin memory views, doorbells, matchers) runs under
        // this guard: a panic is logged and counted and the worker goes on, so the state
        // (Running, one live worker) stays true.
        if running {
            guarded(&inner, || serve_while_used(&inner, &mut cache, park));
        }
        // One last pass: requests left by kernels that finished (FREE needs no answer) and
        // exchanges that can still end. Then either a shutdown is under way (the exchanges
        // lose their server: quarantined, see `dispatch`), or no user was left when the worker
        // looked: the exchanges of kernels that are gone are drained, and those of a kernel that
        // came since stay for the next stretch (`PassCache::clear_gone`).
        guarded(&inner, || {
            Inner::serve_pass(&inner, &mut cache);
            if this.stopping() {
                cache.clear(&inner.context, Fate::Quarantine, "server shutting down");
            } else {
                cache.clear_gone(&inner.context, "no running kernel can answer");
            }
        });
        // Lines the budget dropped in this stretch are told now, even if no later line comes.
        inner
            .context
            .log_limit
            .report_dropped(&inner.context.config.name);
        // The mailboxes were let go of just above: a `detach` may be waiting for that.
        if !this.stretch_done() {
            break;
        }
    }
    // A shutdown that began after the last pass's look finds exchanges kept for a new kernel:
    // they lose their server too.
    guarded(&inner, || {
        cache.clear(&inner.context, Fate::Quarantine, "server shutting down")
    });
    // The device's output still queued for a slow reader is written within the grace or given
    // up (counted in `output_lost_bytes`), which also ends an I/O thread's wait for it; then,
    // within what is left of the same grace, the I/O threads stop with the worker (here, so
    // that a worker nobody joins, see `abandon_from_worker`, stops them too). No blocking call
    // comes after the last pass. So a shutdown takes at most `io_grace` beyond its last pass.
    let deadline = Instant::now() + inner.context.config.io_grace;
    let stopping = inner.io.begin_stop();
    guarded(&inner, || inner.context.extension.worker_exiting(deadline));
    let stuck = inner.io.wait_stopped(stopping, deadline);
    // After the output's last word (its lost bytes are logged within the budget too).
    inner
        .context
        .log_limit
        .report_dropped(&inner.context.config.name);
    if stuck > 0 {
        log::error!(
            "{}: {stuck} I/O thread(s) still inside a blocking call after {:?}: abandoned",
            inner.context.config.name,
            inner.context.config.io_grace
        );
        for _ in 0..stuck {
            bump(&inner.context.stats.io_threads_abandoned);
        }
    }
    // RMW: this worker is gone (counted in by `ServerThread::start`; Relaxed: a `shutdown`
    // that joins it sees this through the join).
    inner
        .context
        .stats
        .live_workers
        .fetch_sub(1, Ordering::Relaxed);
}

/// Runs `body`, catching a panic: logged and counted in `panics`.
fn guarded(inner: &Inner, body: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        log::error!(
            "{}: the server thread caught a panic outside any handler: {}",
            inner.context.config.name,
            crate::server::panic_message(panic.as_ref())
        );
        bump(&inner.context.stats.panics);
    }
}

/// Serves passes with back-off until the users are gone or a shutdown begins.
fn serve_while_used(inner: &Arc<Inner>, cache: &mut PassCache, park: Parks) {
    let this = &inner.thread;
    let mut slack = TimerSlack::tight();
    let (spin, yield_) = BACKOFF_PASSES;
    let mut idle: u32 = 0;
    // When the silence the parks grow with began: read once the passes after the last work
    // are past the hot ones (some 32 units of scanning, a µs or two after the last work),
    // not at every pass that finds work, so that a request costs no clock read.
    let mut quiet_since = None;
    loop {
        // A shutdown must not wait for a quiet moment: under steady traffic every pass finds
        // work and the idle check below never comes.
        if this.stopping() {
            return;
        }
        // Back-off in units of 256 ports scanned without work (at least one a pass), so that
        // it lasts about as long (in time) however many ports there are: 96 back-to-back
        // passes over 16384 ports would hold the CPU for some 240 µs, which a client sharing
        // that CPU would wait through. A pass that made progress counts the ports it scanned
        // after its last progress: after answering a client that shares our CPU (another
        // program keeps the other busy), a scan of 16384 ports is already some 3 µs of that
        // client waiting for us to yield. A phase ends once its units are done (`<`): one
        // idle scan of 16384 ports (64 units) ends the spinning, as 64 passes over 64 ports do.
        if Inner::serve_pass(inner, cache) > 0 {
            quiet_since = None;
            idle = (cache.quiet_ports() / UNIT_PORTS) as u32;
            if idle == 0 {
                continue;
            }
        } else {
            idle = idle.saturating_add((cache.ports() / UNIT_PORTS).max(1) as u32);
        }
        #[allow(clippy::absurd_extreme_comparisons)] // HOT_PASSES is 0 under loom.
        if idle < HOT_PASSES && !takes_turns(cache.yield_every, || CROWDING.skips_yields(false)) {
            // Right after serving, the next request of a client in a loop is a cross-core
            // transfer away: poll back to back (a PAUSE here would add half its length to the
            // average detection delay of every round trip). Not while the worker takes turns
            // with another thread on its CPU: a client there sends nothing until we yield.
            continue;
        }
        // A silence is one wait of the crowded-CPU note (`protocol::port::Crowding`): where
        // the CPUs are crowded each yield would hand a busy process a time slice, while a
        // park's wake-up runs the worker again within microseconds.
        let crowded = CROWDING.skips_yields(quiet_since.is_none());
        let silent_from = *quiet_since.get_or_insert_with(Instant::now);
        if idle < spin && cache.yield_every.is_none() {
            crate::sync::spin_hint();
        } else if idle < yield_ && !crowded {
            // While yields run other threads, one may be a client waiting for this CPU (the
            // loaded regime, `docs/performance.md`): the spin phase (32 more units, a spin hint
            // each) is left out, and a pass over many ports yields within its scan (`yield_every`).
            cache.yield_every =
                yield_to_others().then(|| scan_before_yield(CROWDING.skips_yields(false)));
        } else {
            if crowded {
                // A crowd another thread's yield found since ours: yield within a pass as
                // seldom as while crowded (`scan_before_yield`).
                cache.yield_every = cache.yield_every.map(|_| scan_before_yield(true));
            }
            let silence = silent_from.elapsed();
            if silence >= exec::KEEP_LARGE_FOR {
                exec::release_large();
            }
            let length = park.after(silence);
            // The plugin's doorbells are asked before the server thread's lock is taken (no
            // plugin code runs under it, see `thread`). Sleeping on one is not a wait on its
            // condition variable: a new user or a shutdown waits at most `doorbell_sleep` for
            // it, whenever the doorbell was asked, so asking first loses no wake-up.
            let bell = if park.bell_instead(length) {
                cache.quiet_doorbell()
            } else {
                None
            };
            if let Some(bell) = bell {
                if !this.keep_serving(None) {
                    return;
                }
                // No request is open anywhere: sleep until the device rings, polling anyway
                // after `doorbell_sleep`. A new user or a shutdown waits at most that long.
                let stats = &inner.context.stats;
                bump(&stats.doorbell_sleeps);
                if bell.wait(inner.context.config.doorbell_sleep) {
                    bump(&stats.doorbell_rings);
                }
                continue;
            }
            slack.set(length < park.most);
            if !this.keep_serving(Some(length)) {
                return;
            }
        }
    }
}

/// Whether the worker takes turns with another thread on its CPU: its last yield ran one
/// (`PassCache::yield_every` is set) and the CPUs are not `crowded`
/// (`protocol::port::Crowding`: no busy thread took time slices from our yields). That thread
/// is most often a client sharing the CPU (the loaded regime, `docs/performance.md`), which can
/// send its next request only once the worker yields: the hot passes after an answer would
/// only delay it, so the worker yields as soon as a pass finds nothing. A client on another CPU
/// meanwhile waits at most that thread's turn; the first yield that runs nobody ends the turns.
/// (`crowded` is asked only then: a pass alone on its CPU reads no more than before.)
fn takes_turns(yield_every: Option<usize>, crowded: impl FnOnce() -> bool) -> bool {
    yield_every.is_some() && !crowded()
}

/// The ports a pass scans with no progress before it yields within its scan, while the
/// worker's yields run other threads (`PassCache::yield_every`): one unit, so that a pass over
/// many ports yields at the sweep's next checkpoint after its last progress (some 80 ns after
/// an answer, not a scan of 32 units, some 1.2 µs, later); where the CPUs are `crowded`, the
/// hot passes' 32 units, so that a pass hands a busy thread a time slice as seldom as before.
fn scan_before_yield(crowded: bool) -> usize {
    if crowded {
        HOT_PASSES as usize * UNIT_PORTS
    } else {
        UNIT_PORTS
    }
}

/// Where every mailbox has a doorbell, the worker sleeps on them instead of a park this long or
/// longer. A request after such a sleep waits for the interrupt's wake-up (some 45 µs in this
/// VM, `docs/performance.md`); one after a park waits about half the park plus a timer's
/// wake-up (some 15 µs). So the short parks right after traffic stay (they answer sooner), and
/// the long ones, which would each cost a timer's wake-up, are slept through.
const BELL_AFTER_PARK: Duration = Duration::from_micros(50);

/// The shortest timed park, right after the spin and yield passes.
#[cfg(not(loom))]
const FIRST_PARK: Duration = Duration::from_micros(5);

/// The bounds of the timed parks (`ServerConfig::park` and `absent_park`).
#[derive(Clone, Copy)]
struct Parks {
    most: Duration,
    #[cfg_attr(loom, allow(dead_code))] // Under loom every park is `most`.
    absent: Option<Duration>,
}

impl Parks {
    /// The park after `silence` without work: an eighth of the silence, at least
    /// [`FIRST_PARK`], at most `most`, or `absent` after [`ABSENT_AFTER`] where that is set.
    /// Short parks first, because a kernel that went quiet for a moment often speaks again
    /// soon: a request after 100 µs of silence waits at most some 12 µs. Long ones in a long
    /// silence, because each wake-up costs the worker several µs of CPU (in a VM: a timer
    /// interrupt, a futex syscall and a context switch each way), so the CPU share is about
    /// that cost over the park length; the wake-up latency then is about half a park plus
    /// that cost (`docs/performance.md`). Growing by the silence, not by the number of parks,
    /// keeps the ramp the same whatever one pass costs.
    #[cfg(not(loom))]
    fn after(self, silence: Duration) -> Duration {
        let most = match self.absent {
            Some(absent) if silence >= ABSENT_AFTER => absent.max(self.most),
            _ => self.most,
        };
        (silence / 8).clamp(FIRST_PARK.min(most), most)
    }

    /// Under loom every park is the same (its timed waits never time out anyway).
    #[cfg(loom)]
    fn after(self, _: Duration) -> Duration {
        self.most
    }

    /// Whether to sleep on the doorbells, where every mailbox has one, instead of a park of
    /// `length`: from [`BELL_AFTER_PARK`] on, or from the longest park where that is shorter.
    fn bell_instead(self, length: Duration) -> bool {
        length >= BELL_AFTER_PARK.min(self.most)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The parks of a server whose clients are visible (a kernel), the longest `most`.
    fn kernel_parks(most: Duration) -> Parks {
        Parks { most, absent: None }
    }

    #[test]
    fn parks_grow_with_the_silence_up_to_park_and_past_it_only_for_absent_clients() {
        let us = Duration::from_micros;
        let kernel = kernel_parks(us(250));
        assert_eq!(kernel.after(Duration::ZERO), FIRST_PARK);
        assert_eq!(kernel.after(us(100)), Duration::from_nanos(12_500));
        assert_eq!(kernel.after(us(1000)), us(125));
        assert_eq!(kernel.after(us(2000)), us(250));
        assert_eq!(kernel.after(Duration::from_secs(3600)), us(250));
        let invisible = Parks {
            most: us(250),
            absent: Some(Duration::from_millis(20)),
        };
        assert_eq!(invisible.after(us(100)), kernel.after(us(100)));
        assert_eq!(invisible.after(ABSENT_AFTER - us(1)), us(250));
        assert_eq!(invisible.after(ABSENT_AFTER), Duration::from_millis(20));
        // A park below FIRST_PARK is taken as asked, never raised above it.
        let tiny = kernel_parks(us(2));
        assert_eq!(tiny.after(Duration::from_secs(1)), us(2));
    }

    #[test]
    fn taking_turns_leaves_out_the_hot_passes_and_yields_at_the_next_checkpoint() {
        use crate::protocol::server_end::HOT_STRIDE;
        // Alone on its CPU (its yields run nobody), or crowded: the hot passes stay.
        assert!(!takes_turns(None, || false));
        assert!(!takes_turns(None, || true));
        assert!(!takes_turns(Some(scan_before_yield(true)), || true));
        // Its yields run a thread that gives the CPU back: turns.
        assert!(takes_turns(Some(scan_before_yield(false)), || false));
        // Taking turns, a long pass yields at the first checkpoint after its last progress;
        // crowded, only after as many ports as the hot passes scan.
        assert!(scan_before_yield(false) <= HOT_STRIDE);
        assert_eq!(scan_before_yield(true), HOT_PASSES as usize * UNIT_PORTS);
        assert!(scan_before_yield(true) > HOT_STRIDE);
    }

    #[test]
    fn doorbells_replace_the_parks_of_50_us_and_longer_or_the_longest() {
        let us = Duration::from_micros;
        let kernel = kernel_parks(us(250));
        // A request after 100 µs of silence finds the worker in a short park, not asleep.
        assert!(!kernel.bell_instead(kernel.after(us(100))));
        assert!(!kernel.bell_instead(kernel.after(us(399))));
        assert!(kernel.bell_instead(kernel.after(us(400))));
        assert!(kernel.bell_instead(kernel.after(Duration::from_secs(1))));
        // Parks configured shorter than 50 µs: the doorbell from the longest park on.
        let short = kernel_parks(us(20));
        assert!(!short.bell_instead(short.after(us(100))));
        assert!(short.bell_instead(short.after(us(160))));
    }
}
