//! `ServerThread`: the state machine of a server's one worker thread.
//!
//! ```text
//!            start (spawns)                shutdown (notifies, joins)
//!  Stopped ─────────────────> Running ─────────────────> Stopping ──(joined)──> Stopped
//!     ^  start: AlreadyRunning ─┘ ^                          │ start/shutdown wait
//!     └───────────────────────────┴──────────────────────────┘ for Stopped here
//! ```
//! This file is the worker's synchronisation: the states, the user count and every wait on
//! `cv`; what the worker does between its waits (passes, back-off, doorbells) is
//! [`worker`](crate::server::worker), which calls the waits below. It names nothing of the
//! server it runs for (`cargo xtask tidy` checks that it does not use `server/mod.rs`), so the
//! argument below needs no other file.
//!
//! Every transition happens inside one critical section of `control`, so:
//! - exactly one worker exists while Running (only the Stopped -> Running transition spawns);
//! - a `start` that meets Stopping waits until the previous worker is joined, so no worker is
//!   ever assigned while another is being joined;
//! - a `shutdown` that meets Stopping waits for the joining one to finish and then reports
//!   `AlreadyStopped`, so every `shutdown` returns only after the worker exited.
//!
//! | field | written by | when |
//! |---|---|---|
//! | `state`, `handle`, `worker` | start / shutdown | under `control` |
//! | `stopping` | shutdown (set, cleared) | under `control`; read anywhere |
//! | `users`, `epoch` | `add_user` / `remove_user` (a `UserGuard`'s new / drop) | under `control` |
//!
//! # What runs under `control`
//! Only the bookkeeping of this table: reading and writing the fields, spawning the worker (so
//! that Running and its handle are one step), notifying `cv`, and a user's ticket in its
//! `Coverage` (a lock of its own, taken inside this one and never the other way round). No
//! plugin hook (`AtomicMailbox::view`, a `Doorbell`, a `SharedRegion`), no handler or matcher,
//! no `log` call and no drop of a mailbox runs under it: each of those may call back into the
//! server, which takes `control` again and would deadlock, or panic midway through a
//! transition. So the forced-shutdown and statistics lines are logged after the lock is
//! released, the doorbells are asked before the worker takes it to park, and `detach` drops
//! the mailbox after its wait.
//!
//! # Sleep and wake (why no wake-up is lost)
//! The worker sleeps on `cv` (`wait_for_users`) only after checking, under `control`, that the state is Running,
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
//! `yield_now` (left out where the CPUs are crowded, `protocol::port::Crowding`), then timed
//! parks on `cv` (`keep_serving`) that grow with the silence (an eighth of it, from a
//! few µs) up to `ServerConfig::park`, or past it up to `absent_park` after a second of silence
//! where that is set (the poll goes on, so a request never waits longer than one park plus
//! one pass; device clients cannot notify us). Before each park it re-checks, under `control`,
//! whether the users are gone (then it does one last pass, for requests that need no answer
//! such as FREE, and sleeps) or the state left Running (then it does the same last pass and
//! exits). A shutdown also sets `stopping`, which the worker reads before every pass, so it
//! leaves even while every pass finds work (steady traffic never lets it go idle).
//!
//! Exchanges suspended in flight (see [`crate::server::dispatch`]) never outlive a stretch of serving
//! into a sleep: after the last pass, those of kernels that are gone are ended (their ports
//! drained), and at a shutdown all lose their server (ended, ports quarantined; so too, after
//! the loop, any kept when a shutdown began after that look). One may stay only if its kernel
//! arrived after the worker saw no user (the last pass can open such a kernel's request, and
//! draining it midway would answer the rest of its script with failures); that arrival moved
//! `epoch`, so the next `wait_for_users` does not sleep, and the next stretch serves it. So a
//! sleeping or exited worker holds no mailbox, and `detach` never waits on it. A stopping
//! worker's last pass opens no new port: requests still pending wait for the next worker
//! instead of being cut.

use std::string::String;
use std::time::Duration;

use crate::server::error::ServerError;
use crate::server::mailboxes::Attached;
use crate::server::stats::{bump, Stats};
use crate::server::users::Coverage;
use crate::sync::{self, lock, thread, Arc, AtomicBool, Condvar, Mutex, MutexGuard, Ordering};

/// What to do when `shutdown` finds kernels still holding user guards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShutdownPolicy {
    /// Return [`ServerError::LiveUsers`] and keep serving.
    Refuse,
    /// Wait up to this long for the guards to go, then refuse as above.
    Wait(Duration),
    /// Stop anyway, logging an error: the kernels lose their server.
    Force,
}

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
    state: State,
    users: usize,
    /// Bumped by every new user, so a user that came and went while the worker was not looking
    /// (its requests may still be pending) still gets a pass.
    epoch: u64,
    handle: Option<thread::JoinHandle<()>>,
    worker: Option<thread::ThreadId>,
}

/// A server's worker thread: its state, the condition variable it sleeps on, its users.
pub(crate) struct ServerThread {
    /// The server's name: the worker is `rpc-{name}`, and the logs say it.
    name: String,
    control: Mutex<Control>,
    /// Signalled on: a first user, the last user gone, a state change, a detach.
    cv: Condvar,
    /// Set while a shutdown is in progress: the worker leaves at its next pass, and waits on
    /// clients give up. Relaxed everywhere: it only asks to leave sooner; the state, read
    /// under `control`, decides.
    stopping: AtomicBool,
}

impl ServerThread {
    pub(crate) fn new(name: String) -> Self {
        ServerThread {
            name,
            control: Mutex::new(Control {
                state: State::Stopped,
                users: 0,
                epoch: 0,
                handle: None,
                worker: None,
            }),
            cv: Condvar::new(),
            stopping: AtomicBool::new(false),
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

    /// True while a shutdown is under way.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
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

    /// Spawns `worker` (which calls the waits below, see [`crate::server::worker`]) unless a
    /// worker runs already.
    pub(crate) fn start(
        &self,
        stats: &Stats,
        worker: impl FnOnce() + Send + 'static,
    ) -> Result<Started, ServerError> {
        let control = lock(&self.control);
        // From a handler, on the worker itself: it runs (or, in its last pass, is stopping and
        // cannot wait for itself to be joined).
        if control.worker == Some(thread::current().id()) {
            return match control.state {
                State::Running => Ok(Started::AlreadyRunning),
                _ => Err(ServerError::Refused(
                    "start called from the server's own worker while it stops".into(),
                )),
            };
        }
        let mut control = self.settle(control);
        if control.state == State::Running {
            return Ok(Started::AlreadyRunning);
        }
        let name: String = std::format!("rpc-{}", self.name);
        let handle = sync::spawn(name, worker).map_err(|e| ServerError::Spawn(e.to_string()))?;
        // RMW: one more live worker, counted from its spawn (the worker counts itself out as
        // it leaves). Relaxed, as every statistic: a read-modify-write reads the latest count
        // whatever the ordering, so the high-water mark below is exact.
        let alive = stats.live_workers.fetch_add(1, Ordering::Relaxed) + 1;
        // RMW: the high-water mark rises to `alive` if below.
        stats.max_live_workers.fetch_max(alive, Ordering::Relaxed);
        control.worker = Some(handle.thread().id());
        control.handle = Some(handle);
        control.state = State::Running;
        bump(&stats.workers_started);
        Ok(Started::Started)
    }

    pub(crate) fn shutdown(&self, policy: ShutdownPolicy) -> Result<Stopped, ServerError> {
        let name = &self.name;
        let mut control = lock(&self.control);
        // From a handler, on the worker itself: it cannot join itself (checked before waiting
        // for a stopping worker, which may be this one in its last pass).
        if control.worker == Some(thread::current().id()) {
            return Err(ServerError::Refused(
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
            control = self.settle(control);
            if control.state == State::Stopped {
                return Ok(Stopped::AlreadyStopped);
            }
            if control.users == 0 {
                break;
            }
            match policy {
                ShutdownPolicy::Refuse => return Err(ServerError::LiveUsers(control.users)),
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
                        return Err(ServerError::LiveUsers(control.users));
                    }
                    control = self
                        .cv
                        .wait_timeout(control, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    // Re-check everything: another caller may have stopped it meanwhile.
                }
            }
        }
        control.state = State::Stopping;
        self.stopping.store(true, Ordering::Relaxed);
        let handle = control.handle.take();
        self.cv.notify_all();
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
        let mut control = lock(&self.control);
        control.state = State::Stopped;
        control.worker = None;
        self.stopping.store(false, Ordering::Relaxed);
        self.cv.notify_all();
        Ok(Stopped::Stopped)
    }

    /// The last `RpcServer` was dropped by a handler, on the worker: it cannot join itself. It
    /// is told to stop and left to finish by itself (it stops the I/O threads as it leaves),
    /// and with its end the last reference to the server's state goes, mailboxes included.
    pub(crate) fn abandon_from_worker(&self) {
        let mut control = lock(&self.control);
        control.state = State::Stopping;
        self.stopping.store(true, Ordering::Relaxed);
        // Dropped, not joined: the thread runs on, detached, until its loop sees Stopping.
        drop(control.handle.take());
        self.cv.notify_all();
    }

    /// The worker's sleep: while Running with no user, and none came since it last looked
    /// (`seen_epoch`, updated here), it waits on `cv` (see "Sleep and wake"). Counts the sleep
    /// and the wake-up by a user. Returns whether it should serve (Running) or leave after its
    /// last pass.
    pub(crate) fn wait_for_users(&self, stats: &Stats, seen_epoch: &mut u64) -> bool {
        let mut control = lock(&self.control);
        let idle =
            |c: &Control| c.state == State::Running && c.users == 0 && c.epoch == *seen_epoch;
        if idle(&control) {
            bump(&stats.sleeps);
        }
        while idle(&control) {
            control = self.cv.wait(control).unwrap_or_else(|e| e.into_inner());
            if control.epoch != *seen_epoch {
                bump(&stats.wakeups);
            }
        }
        *seen_epoch = control.epoch;
        control.state == State::Running
    }

    /// Whether the worker should go on serving passes: Running, with users (checked under
    /// `control`). If so and `park` is given, it first parks that long on `cv`: a new user, a
    /// shutdown or a detach cuts the park short.
    pub(crate) fn keep_serving(&self, park: Option<Duration>) -> bool {
        let control = lock(&self.control);
        if control.state != State::Running || control.users == 0 {
            return false;
        }
        if let Some(park) = park {
            park_for(&self.cv, control, park);
        }
        true
    }

    /// After the worker's last pass of a stretch, which let go of every mailbox: wakes a
    /// `detach` waiting for that, and says whether the worker goes on (Running) or exits.
    pub(crate) fn stretch_done(&self) -> bool {
        let control = lock(&self.control);
        self.cv.notify_all();
        control.state == State::Running
    }
}

/// A timed park on `cv`.
#[cfg(not(loom))]
fn park_for(cv: &Condvar, control: MutexGuard<'_, Control>, park: Duration) {
    let _ = cv
        .wait_timeout(control, park)
        .unwrap_or_else(|e| e.into_inner());
}

/// loom's timed waits never time out (a request arriving during one would never be seen), so
/// the model yields instead: the same poll, without the timer.
#[cfg(loom)]
fn park_for(_: &Condvar, control: MutexGuard<'_, Control>, _: Duration) {
    drop(control);
    thread::yield_now();
}
