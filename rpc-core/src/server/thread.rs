//! `ServerThread`: the state machine of a server's one worker thread.
//!
//! ```text
//!            start (spawns)                shutdown (notifies, joins)
//!  Stopped ─────────────────> Running ─────────────────> Stopping ──(joined)──> Stopped
//!     ^  start: AlreadyRunning ─┘ ^                          │ start/shutdown wait
//!     └───────────────────────────┴──────────────────────────┘ for Stopped here
//! ```
//! Every transition happens inside one critical section of `control`, so:
//! - exactly one worker exists while Running (only the Stopped -> Running transition spawns);
//! - a `start` that meets Stopping waits until the previous worker is joined, so no worker is
//!   ever assigned while another is being joined;
//! - a `shutdown` that meets Stopping waits for the joining one to finish and then reports
//!   `AlreadyStopped`, so every `shutdown` returns only after the worker exited.
//!
//! | field | written by | when |
//! |---|---|---|
//! | `state`, `handle` | start / shutdown | under `control` |
//! | `users`, `epoch` | `add_user` / `remove_user` (a `UserGuard`'s new / drop) | under `control` |
//!
//! # What runs under `control`
//! Only the bookkeeping of this table: reading and writing the fields, spawning the worker (so
//! that Running and its handle are one step), notifying `cv`, and a user's ticket in its
//! `Coverage` (a lock of its own, taken inside this one and never the other way round). No
//! plugin hook (`MailboxSource::view`, a `Doorbell`, a `SharedRegion`), no handler or matcher,
//! no `log` call and no drop of a mailbox runs under it: each of those may call back into the
//! server, which takes `control` again and would deadlock, or panic midway through a
//! transition. So the forced-shutdown and statistics lines are logged after the lock is
//! released, the doorbells are asked before the worker takes it to park, and `detach` drops
//! the mailbox after its wait.
//!
//! # Sleep and wake (why no wake-up is lost)
//! The worker sleeps on `cv` only after checking, under `control`, that the state is Running,
//! `users == 0` and no user arrived since its last look (`epoch` unchanged). A new user
//! increments `users` and `epoch` under the same lock and then notifies; a shutdown sets
//! Stopping under the lock and then notifies. (`epoch` matters for a user that comes and goes
//! before the worker looks: its requests, e.g. a FREE, still get a pass.) So either the worker's check sees
//! the change, or the worker is already waiting on `cv` (it released the lock atomically with
//! starting to wait) when the notification comes. Spurious wake-ups just re-check. (Each sleep
//! is counted in `sleeps`, each wake-up by a new user in `wakeups`.)
//!
//! While users exist the worker serves passes. After passes that find nothing it backs off:
//! passes back to back (first without, then with a spin hint), then passes separated by
//! `yield_now`, then timed parks on `cv` that grow with the silence (an eighth of it, from a
//! few µs) up to `ServerConfig::park`, or past it up to `absent_park` after a second of silence
//! where that is set (the poll goes on, so a request never waits longer than one park plus
//! one pass; device clients cannot notify us). Before each park it re-checks, under `control`,
//! whether the users are gone (then it does one last pass, for requests that need no answer
//! such as FREE, and sleeps) or the state left Running (then it does the same last pass and
//! exits). A shutdown also sets `stopping`, which the worker reads before every pass, so it
//! leaves even while every pass finds work (steady traffic never lets it go idle).
//!
//! Exchanges suspended in flight (see [`crate::server::dispatch`]) never outlive a stretch of serving:
//! after the last pass, with no user left every one of them belongs to a kernel that is gone
//! (so they are ended and their ports reset), and at a shutdown they lose their server (ended,
//! ports quarantined). So a sleeping or exited worker holds no mailbox, and `detach` never
//! waits on it. A stopping worker's last pass opens no new port: requests still pending wait
//! for the next worker instead of being cut.

use std::string::String;
use std::time::Instant;

use crate::protocol::error::{Error, Result};
use crate::server::dispatch::{Fate, PassCache};
use crate::server::mailboxes::Attached;
use crate::server::stats::bump;
use crate::server::users::Coverage;
#[cfg(not(loom))]
use crate::server::ABSENT_AFTER;
use crate::server::{Inner, ShutdownPolicy};
use crate::sync::{self, lock, thread, Arc, Condvar, Mutex, MutexGuard, Ordering};

/// The worker's states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Stopped,
    Running,
    Stopping,
}

/// What `start` did.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Started {
    /// This call spawned the worker.
    Started,
    /// A worker was running already; nothing changed.
    AlreadyRunning,
}

/// What `shutdown` did.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// This call stopped and joined the worker.
    Stopped,
    /// No worker was running (or another call stopped it while this one waited).
    AlreadyStopped,
}

pub(crate) struct Control {
    pub(crate) state: State,
    pub(crate) users: usize,
    /// Bumped by every new user, so a user that came and went while the worker was not looking
    /// (its requests may still be pending) still gets a pass.
    pub(crate) epoch: u64,
    handle: Option<thread::JoinHandle<()>>,
    worker: Option<thread::ThreadId>,
}

/// A server's worker thread: its state, the condition variable it sleeps on, its users.
pub(crate) struct ServerThread {
    pub(crate) control: Mutex<Control>,
    /// Signalled on: a first user, the last user gone, a state change, a detach.
    pub(crate) cv: Condvar,
}

/// Back-to-back passes before the worker starts yielding, and passes before it parks (passes
/// over up to 256 ports; a pass over more counts as several).
/// Under loom it parks at once: loom's timed waits never time out, which bounds the model.
#[cfg(not(loom))]
const BACKOFF_PASSES: (u32, u32) = (64, 64 + 256);
#[cfg(loom)]
const BACKOFF_PASSES: (u32, u32) = (0, 0);
/// Idle passes right after a served one that poll again at once, without a spin hint.
#[cfg(not(loom))]
const HOT_PASSES: u32 = 32;
#[cfg(loom)]
const HOT_PASSES: u32 = 0;

impl ServerThread {
    pub(crate) fn new() -> Self {
        ServerThread {
            control: Mutex::new(Control {
                state: State::Stopped,
                users: 0,
                epoch: 0,
                handle: None,
                worker: None,
            }),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn notify(&self) {
        let _control = lock(&self.control);
        self.cv.notify_all();
    }

    /// True on the worker thread itself (a handler calling back into its server).
    pub(crate) fn is_worker(&self) -> bool {
        lock(&self.control).worker == Some(thread::current().id())
    }

    pub(crate) fn is_running(&self) -> bool {
        lock(&self.control).state == State::Running
    }

    /// Live users.
    pub(crate) fn users(&self) -> usize {
        lock(&self.control).users
    }

    /// A new user covered by `covered`: counted, given its ticket, and the worker woken if it
    /// is the first (see "Sleep and wake" above). Returns the ticket.
    pub(crate) fn add_user(&self, covered: &Coverage) -> u64 {
        let mut control = lock(&self.control);
        control.users += 1;
        control.epoch += 1;
        let ticket = covered.arrive();
        if control.users == 1 {
            self.cv.notify_all();
        }
        ticket
    }

    /// The user holding `ticket` in `covered` is gone; the last one wakes a shutdown waiting
    /// for the users to go (the worker notices by itself).
    pub(crate) fn remove_user(&self, covered: &Coverage, ticket: u64) {
        let mut control = lock(&self.control);
        control.users -= 1;
        covered.leave(ticket);
        if control.users == 0 {
            self.cv.notify_all();
        }
    }

    /// Wakes the worker and waits until it lets go of a detached mailbox: at its next pass
    /// (its copy of the list, and the exchanges in flight on it) or before it sleeps, after
    /// which it notifies `cv`. The count drops outside the lock, so the wait is also timed: a
    /// notification that comes between the check and the wait costs at most a millisecond,
    /// never a hang.
    pub(crate) fn wait_released(&self, attached: &Arc<Attached>) {
        let mut control = lock(&self.control);
        self.cv.notify_all();
        while Arc::strong_count(attached) > 1 {
            control = self
                .cv
                .wait_timeout(control, std::time::Duration::from_millis(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits while another caller is stopping the worker.
    fn settle<'a>(&'a self, mut control: MutexGuard<'a, Control>) -> MutexGuard<'a, Control> {
        while control.state == State::Stopping {
            control = self.cv.wait(control).unwrap_or_else(|e| e.into_inner());
        }
        control
    }

    pub(crate) fn start(inner: &Arc<Inner>) -> Result<Started> {
        let this = &inner.thread;
        let control = lock(&this.control);
        // From a handler, on the worker itself: it runs (or, in its last pass, is stopping and
        // cannot wait for itself to be joined).
        if control.worker == Some(thread::current().id()) {
            return match control.state {
                State::Running => Ok(Started::AlreadyRunning),
                _ => Err(Error::Refused(
                    "start called from the server's own worker while it stops".into(),
                )),
            };
        }
        let mut control = this.settle(control);
        if control.state == State::Running {
            return Ok(Started::AlreadyRunning);
        }
        let worker_inner = inner.clone();
        let name: String = std::format!("rpc-{}", inner.context.config.name);
        let handle = sync::spawn(name, move || worker(worker_inner))
            .map_err(|e| Error::Spawn(e.to_string()))?;
        // RMW: one more live worker, counted from its spawn (the worker counts itself out).
        // Relaxed, as every statistic: a read-modify-write reads the latest count whatever
        // the ordering, so the high-water mark below is exact.
        let stats = &inner.context.stats;
        let alive = stats.live_workers.fetch_add(1, Ordering::Relaxed) + 1;
        // RMW: the high-water mark rises to `alive` if below.
        stats.max_live_workers.fetch_max(alive, Ordering::Relaxed);
        control.worker = Some(handle.thread().id());
        control.handle = Some(handle);
        control.state = State::Running;
        bump(&inner.context.stats.workers_started);
        Ok(Started::Started)
    }

    pub(crate) fn shutdown(inner: &Arc<Inner>, policy: ShutdownPolicy) -> Result<Stopped> {
        let this = &inner.thread;
        let name = &inner.context.config.name;
        let mut control = lock(&this.control);
        // From a handler, on the worker itself: it cannot join itself (checked before waiting
        // for a stopping worker, which may be this one in its last pass).
        if control.worker == Some(thread::current().id()) {
            return Err(Error::Refused(
                "shutdown called from the server's own worker".into(),
            ));
        }
        let deadline = match policy {
            ShutdownPolicy::Wait(timeout) => Some(std::time::Instant::now() + timeout),
            _ => None,
        };
        // Users left running by a forced shutdown, logged once the lock is released.
        let mut forced = 0;
        loop {
            control = this.settle(control);
            if control.state == State::Stopped {
                return Ok(Stopped::AlreadyStopped);
            }
            if control.users == 0 {
                break;
            }
            match policy {
                ShutdownPolicy::Refuse => return Err(Error::LiveUsers(control.users)),
                ShutdownPolicy::Force => {
                    forced = control.users;
                    break;
                }
                ShutdownPolicy::Wait(_) => {
                    // A deadline, not a timeout per wake-up: users coming and going notify the
                    // condition variable, which must not restart the wait.
                    let left = deadline
                        .map(|d| d.saturating_duration_since(std::time::Instant::now()))
                        .unwrap_or_default();
                    if left.is_zero() {
                        return Err(Error::LiveUsers(control.users));
                    }
                    control = this
                        .cv
                        .wait_timeout(control, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    // Re-check everything: another caller may have stopped it meanwhile.
                }
            }
        }
        control.state = State::Stopping;
        inner.context.stopping.store(true, Ordering::Relaxed);
        let handle = control.handle.take();
        this.cv.notify_all();
        drop(control);
        if forced > 0 {
            log::error!("{name}: shutting down with {forced} kernel(s) still running");
        }
        if let Some(handle) = handle {
            if handle.join().is_err() {
                log::error!("{name}: the worker thread panicked");
            }
        }
        // (The worker stopped the I/O threads as it left: see `worker`.)
        let mut control = lock(&this.control);
        control.state = State::Stopped;
        control.worker = None;
        inner.context.stopping.store(false, Ordering::Relaxed);
        this.cv.notify_all();
        drop(control);
        if inner.context.config.log_stats_on_shutdown {
            log::info!(
                "{name}: server statistics: {}",
                inner.context.stats.snapshot()
            );
        }
        Ok(Stopped::Stopped)
    }
}

/// Timed parks should last about what they ask for, not the default 50 µs timer slack more.
/// Not under loom or miri (no foreign calls there; their timers have no slack to tighten).
fn tighten_timer_slack() {
    #[cfg(all(target_os = "linux", not(loom), not(miri)))]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and affects only this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
    }
}

fn worker(inner: Arc<Inner>) {
    let this = &inner.thread;
    tighten_timer_slack();
    let mut cache = PassCache::new();
    let park = Parks {
        most: inner.context.config.park,
        absent: inner.context.config.absent_park,
    };
    let mut control = lock(&this.control);
    let mut seen_epoch = 0;
    loop {
        // Asleep while nobody could send a request (see the module docs).
        if control.state == State::Running && control.users == 0 && control.epoch == seen_epoch {
            bump(&inner.context.stats.sleeps);
        }
        while control.state == State::Running && control.users == 0 && control.epoch == seen_epoch {
            control = this.cv.wait(control).unwrap_or_else(|e| e.into_inner());
            if control.epoch != seen_epoch {
                bump(&inner.context.stats.wakeups);
            }
        }
        seen_epoch = control.epoch;
        let running = control.state == State::Running;
        drop(control);
        // Everything the worker calls (plugin memory views, doorbells, matchers) runs under
        // this guard: a panic is logged and counted and the worker goes on, so the state
        // (Running, one live worker) stays true.
        if running {
            guarded(&inner, || serve_while_used(&inner, &mut cache, park));
        }
        // One last pass: requests left by kernels that finished (FREE needs no answer) and
        // exchanges that can still end. Then no user is left (every exchange still in flight
        // belongs to a kernel that is gone) or a shutdown is under way (the exchanges lose
        // their server: quarantined, see `dispatch`).
        guarded(&inner, || {
            Inner::serve_pass(&inner, &mut cache);
            if inner.context.stopping.load(Ordering::Relaxed) {
                cache.clear(&inner.context, Fate::Quarantine, "server shutting down");
            } else {
                cache.clear(&inner.context, Fate::Reset, "no running kernel can answer");
            }
        });
        control = lock(&this.control);
        // The mailboxes were let go of just above: a `detach` may be waiting for that.
        this.cv.notify_all();
        if control.state != State::Running {
            break;
        }
    }
    drop(control);
    // No blocking call comes after the last pass: the I/O threads stop with the worker (here,
    // so that a worker nobody joins, see `abandon_from_worker`, stops them too).
    let stuck = inner.io.stop(inner.context.config.io_grace);
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
    // RMW: this worker is gone (Relaxed: a `shutdown` that joins it sees this through the
    // join).
    inner
        .context
        .stats
        .live_workers
        .fetch_sub(1, Ordering::Relaxed);
}

impl ServerThread {
    /// The last `RpcServer` was dropped by a handler, on the worker: it cannot join itself. It
    /// is told to stop and left to finish by itself (it stops the I/O threads as it leaves),
    /// and with its end the last reference to the server's state goes, mailboxes included.
    pub(crate) fn abandon_from_worker(inner: &Inner) {
        let this = &inner.thread;
        let mut control = lock(&this.control);
        control.state = State::Stopping;
        inner.context.stopping.store(true, Ordering::Relaxed);
        // Dropped, not joined: the thread runs on, detached, until its loop sees Stopping.
        drop(control.handle.take());
        this.cv.notify_all();
    }
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
    let (spin, yield_) = BACKOFF_PASSES;
    let mut idle: u32 = 0;
    // When the last pass that found work ended: the silence the parks grow with.
    let mut last_work = Instant::now();
    loop {
        // A shutdown must not wait for a quiet moment: under steady traffic every pass finds
        // work and the idle check below never comes. Relaxed: `stopping` only asks us to leave
        // sooner; the state, read under `control` before the worker exits, decides.
        if inner.context.stopping.load(Ordering::Relaxed) {
            return;
        }
        if Inner::serve_pass(inner, cache) > 0 {
            idle = 0;
            last_work = Instant::now();
            continue;
        }
        // Back-off in units of a pass over up to 256 ports, so that it lasts about as long (in
        // time) however many ports there are: 96 back-to-back passes over 16384 ports would
        // hold the CPU for some 240 µs, which a client sharing that CPU would wait through.
        idle = idle.saturating_add((cache.ports() / 256).max(1) as u32);
        #[allow(clippy::absurd_extreme_comparisons)] // HOT_PASSES is 0 under loom.
        if idle <= HOT_PASSES {
            // Right after serving, the next request of a client in a loop is a cross-core
            // transfer away: poll back to back (a PAUSE here would add half its length to the
            // average detection delay of every round trip).
        } else if idle <= spin {
            crate::sync::spin_hint();
        } else if idle <= yield_ {
            thread::yield_now();
        } else {
            // The plugin's doorbells are asked before the lock is taken (no plugin code runs
            // under `control`, see the module docs). Sleeping on one is not a wait on `cv`: a
            // new user or a shutdown waits at most `doorbell_sleep` for it, whenever the
            // doorbell was asked, so asking first loses no wake-up.
            let bell = cache.quiet_doorbell();
            let control = lock(&this.control);
            if control.state != State::Running || control.users == 0 {
                return;
            }
            if let Some(bell) = bell {
                // No request is open anywhere: sleep until the device rings, polling anyway
                // after `doorbell_sleep`. A new user or a shutdown waits at most that long.
                drop(control);
                let stats = &inner.context.stats;
                bump(&stats.doorbell_sleeps);
                if bell.wait(inner.context.config.doorbell_sleep) {
                    bump(&stats.doorbell_rings);
                }
                continue;
            }
            park_for(this, control, park.after(last_work.elapsed()));
        }
    }
}

/// The shortest timed park, right after the spin and yield passes.
#[cfg(not(loom))]
const FIRST_PARK: std::time::Duration = std::time::Duration::from_micros(5);

/// The bounds of the timed parks (`ServerConfig::park` and `absent_park`).
#[derive(Clone, Copy)]
struct Parks {
    most: std::time::Duration,
    #[cfg_attr(loom, allow(dead_code))] // Under loom every park is `most`.
    absent: Option<std::time::Duration>,
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
    fn after(self, silence: std::time::Duration) -> std::time::Duration {
        let most = match self.absent {
            Some(absent) if silence >= ABSENT_AFTER => absent.max(self.most),
            _ => self.most,
        };
        (silence / 8).clamp(FIRST_PARK.min(most), most)
    }

    /// Under loom every park is the same (its timed waits never time out anyway).
    #[cfg(loom)]
    fn after(self, _: std::time::Duration) -> std::time::Duration {
        self.most
    }
}

/// A timed park on `cv`: a new user, a shutdown or a detach cuts it short.
#[cfg(not(loom))]
fn park_for(this: &ServerThread, control: MutexGuard<'_, Control>, park: std::time::Duration) {
    let _ = this
        .cv
        .wait_timeout(control, park)
        .unwrap_or_else(|e| e.into_inner());
}

/// loom's timed waits never time out (a request arriving during one would never be seen), so
/// the model yields instead: the same poll, without the timer.
#[cfg(loom)]
fn park_for(_: &ServerThread, control: MutexGuard<'_, Control>, _: std::time::Duration) {
    drop(control);
    thread::yield_now();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parks_grow_with_the_silence_up_to_park_and_past_it_only_for_absent_clients() {
        let us = Duration::from_micros;
        let kernel = Parks {
            most: us(250),
            absent: None,
        };
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
        let tiny = Parks {
            most: us(2),
            absent: None,
        };
        assert_eq!(tiny.after(Duration::from_secs(1)), us(2));
    }
}
