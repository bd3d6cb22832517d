//! The file policy through the protocol: OPEN_FILE, REMOVE and RENAME as a hostile device sends
//! them, against a running `RpcServer`, for L = 1 and for L = 32 with a partial mask. The
//! attacks of issue 15 (`/proc/self/mem` to flip the server's own policy, paths out of the
//! sandbox, FIFOs that block, the mailbox opened for writing) each end in a refusal, with the
//! host untouched. (The resolvers on their own, `openat2` and the walk, are tested in
//! `services/files.rs`.)
//!
//! One port per mailbox: a client's next request on it is answered only after the server closed
//! the previous one, and so counted it, so the statistics read after a round trip are exact.
#![cfg(not(loom))]

mod common;

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use common::{Device, Mailbox};
use rpc_core::protocol::ClientPort;
use rpc_core::protocol::Deadline;
use rpc_core::{ExitPolicy, FilePolicy, ServicesConfig};
use rpc_core::{Opcode, RpcServer, ServerConfig, StatsSnapshot, UserGuard};

/// (L, mask) pairs every test runs with.
const CONFIGS: [(u32, u64); 2] = [(1, 1), (32, 0x8000_1235)];
const MINUS_ONE: u64 = u64::MAX;

struct Fx {
    mask: u64,
    mailbox: Mailbox,
    dir: PathBuf,
    /// Client waits give up here, so a server that blocks fails the test instead of hanging it.
    deadline: Deadline,
    _user: UserGuard,
    server: RpcServer,
}

impl Fx {
    fn new(name: &str, lanes: u32, mask: u64, files: FilePolicy) -> Fx {
        let _ = env_logger::builder().is_test(true).try_init();
        let server = RpcServer::new(ServerConfig {
            name: format!("{name}-L{lanes}"),
            services: ServicesConfig {
                exit: ExitPolicy::Record,
                files,
                ..ServicesConfig::default()
            },
            ..ServerConfig::default()
        });
        let mailbox = Mailbox::attach(&server, 1, lanes);
        server
            .context()
            .services()
            .set_stdout(Box::new(std::io::sink()));
        let _ = server.start().unwrap();
        Fx {
            mask,
            mailbox,
            dir: common::empty_dir(&format!("file-policy-{name}-{lanes}")),
            deadline: common::hang_guard(),
            _user: server.user(),
            server,
        }
    }

    /// A fixture under `FilePolicy::Allow` for each of `CONFIGS` in turn (each dropped before
    /// the next is made).
    fn each(name: &'static str) -> impl Iterator<Item = Fx> {
        CONFIGS
            .into_iter()
            .map(move |(lanes, mask)| Fx::new(name, lanes, mask, FilePolicy::Allow))
    }

    fn services(&self) -> &rpc_core::services::Services {
        self.server.context().services()
    }

    fn lanes(&self) -> Vec<u32> {
        rpc_core::protocol::lanes(self.mask).collect()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The statistics once every earlier request was closed (see the module doc).
    fn settled(&self) -> StatsSnapshot {
        let mut port = self.open(Opcode::TEST_INCREMENT);
        port.send_and_recv(|_, p| p.set_word(0, 1), |_, _| {})
            .unwrap();
        drop(port);
        self.server.stats()
    }

    /// Asserts the server settled (see `settled`) with `refused` refusals and no file open.
    fn expect_settled(&self, refused: u64) {
        assert_eq!(self.settled().refused, refused);
        assert_eq!(self.services().open_files(), 0);
    }

    /// Asserts every active lane's reply is `want`.
    fn all(&self, replies: &[u64; 64], want: u64, what: &str) {
        for l in self.lanes() {
            assert_eq!(replies[l as usize], want, "lane {l}: {what}");
        }
    }
}

impl Device for Fx {
    fn open(&self, opcode: Opcode) -> ClientPort<'_> {
        self.mailbox.open(&self.deadline, opcode, self.mask)
    }
}

impl Drop for Fx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The same C string for every lane.
fn every(path: impl AsRef<Path>) -> Vec<Vec<u8>> {
    let mut bytes = path.as_ref().as_os_str().as_bytes().to_vec();
    bytes.push(0);
    vec![bytes; 64]
}

/// A C string per lane.
fn per_lane(f: impl Fn(u32) -> String) -> Vec<Vec<u8>> {
    (0..64)
        .map(|l| {
            let mut bytes = f(l).into_bytes();
            bytes.push(0);
            bytes
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------

/// Issue 15's root shell: OPEN_FILE `/proc/self/maps`, then `/proc/self/mem` "r+", FSEEK to a
/// byte of the server's heap and WRITE_TO_STREAM over it. Under `Allow`, the default, both
/// opens answer 0 (the attack goes as far as it can: had a handle come back, it would have
/// written the byte), SYSTEM still answers -1 and the policy is unchanged.
#[test]
fn proc_self_mem_cannot_rewrite_the_servers_policy() {
    for fx in Fx::each("proc-mem") {
        let before = fx.services().config();
        assert!(!before.allow_system);
        // A byte of the server process's heap standing for `allow_system`.
        let victim = Box::new(AtomicU8::new(0));
        let address = &*victim as *const AtomicU8 as u64;

        let maps = fx.fopen(&every("/proc/self/maps"), "r");
        let mem = fx.fopen(&every("/proc/self/mem"), "r+");
        if fx.lanes().iter().any(|&l| mem[l as usize] != 0) {
            fx.words(Opcode::FSEEK, |l| vec![mem[l as usize], address, 0]);
            fx.write_to_stream(&mem, &vec![vec![1u8]; 64]);
            fx.words(Opcode::FFLUSH, |l| vec![mem[l as usize]]);
        }
        assert_eq!(
            victim.load(Ordering::SeqCst),
            0,
            "the heap byte was written"
        );
        fx.all(&maps, 0, "/proc/self/maps opens");
        fx.all(&mem, 0, "/proc/self/mem opens");
        // The same through other names for it.
        for path in ["/proc/thread-self/../self/mem", "/proc/self/fd/../mem"] {
            fx.all(&fx.fopen(&every(path), "r+"), 0, path);
        }
        let link = fx.path("innocent");
        std::os::unix::fs::symlink("/proc/self/mem", &link).unwrap();
        fx.all(
            &fx.fopen(&every(&link), "r+"),
            0,
            "a link to /proc/self/mem",
        );

        let marker = fx.path("ran");
        let command = every(format!("touch '{}'", marker.display()));
        let system = fx.send_n_then_word(Opcode::SYSTEM, &command);
        fx.all(&system, MINUS_ONE, "SYSTEM");
        assert!(!marker.exists(), "the command ran");
        assert_eq!(fx.services().config(), before, "the policy changed");
        assert!(!fx.services().config().allow_system);
        // Six refusals: maps, mem, two other names, the link, SYSTEM.
        fx.expect_settled(6);
    }
}

/// Under `Sandbox(dir)`: `/etc/passwd`, `../x`, an absolute path outside, a link inside that
/// points outside and a `..` walk are refused (and nothing outside is truncated); a relative
/// and an absolute path inside open, with real writes and reads. Lanes differ: even lanes ask
/// for their own file inside, odd lanes for a way out, in the same request.
#[test]
fn the_sandbox_holds_through_the_protocol() {
    for fx in Fx::each("sandbox") {
        let jail = fx.path("jail");
        std::fs::create_dir_all(jail.join("sub")).unwrap();
        let outside = fx.path("outside.txt");
        std::fs::write(&outside, "secret").unwrap();
        std::fs::write(jail.join("inside.txt"), "ok").unwrap();
        std::os::unix::fs::symlink(&outside, jail.join("link")).unwrap();
        fx.services()
            .set_file_policy(FilePolicy::Sandbox(jail.clone()));

        let ways_out = [
            "/etc/passwd".to_string(),
            "../outside.txt".to_string(),
            outside.display().to_string(),
            "link".to_string(),
            "sub/../../outside.txt".to_string(),
            format!("{}/../outside.txt", jail.display()),
        ];
        let mut refused = 0;
        for way in &ways_out {
            for mode in ["r", "w", "a+"] {
                fx.all(&fx.fopen(&every(way), mode), 0, way);
                refused += 1;
            }
        }
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "secret");

        // Mixed lanes: even lanes write their own file (relative on lanes 0 mod 4, absolute
        // on 2 mod 4), odd lanes try a way out.
        let name = |l: u32| format!("lane{l}.txt");
        let paths = per_lane(|l| match l % 4 {
            0 => name(l),
            2 => jail.join(name(l)).display().to_string(),
            _ => ways_out[l as usize % ways_out.len()].clone(),
        });
        // A request counts one refusal however many of its lanes were refused.
        let odd = u64::from(fx.lanes().iter().any(|l| l % 2 == 1));
        let handles = fx.fopen(&paths, "w+");
        refused += odd;
        for l in fx.lanes() {
            assert_eq!(handles[l as usize] != 0, l % 2 == 0, "lane {l}");
        }
        let data: Vec<Vec<u8>> = (0..64)
            .map(|l| format!("written by {l}").into_bytes())
            .collect();
        fx.write_to_stream(&handles, &data);
        // Odd lanes hold handle 0, not a live stream: refused (nothing written).
        refused += odd;
        fx.words(Opcode::FSEEK, |l| vec![handles[l as usize], 0, 0]);
        refused += odd;
        let back = fx.fread(100, &handles).0;
        refused += odd;
        fx.on_handles(Opcode::CLOSE_FILE, &handles);
        refused += odd;
        for l in fx.lanes().into_iter().filter(|l| l % 2 == 0) {
            assert_eq!(back[l as usize], data[l as usize], "lane {l} reads back");
            assert_eq!(
                std::fs::read(jail.join(name(l))).unwrap(),
                data[l as usize],
                "lane {l}'s file"
            );
        }
        let inside = fx.fopen(&every("inside.txt"), "r");
        let read = fx.fread(10, &inside).0;
        for l in fx.lanes() {
            assert_eq!(read[l as usize], b"ok");
        }
        fx.on_handles(Opcode::CLOSE_FILE, &inside);

        // REMOVE and RENAME: outside refused, inside done.
        for way in [
            "../outside.txt".to_string(),
            outside.display().to_string(),
            "sub/../../outside.txt".to_string(),
            format!("{}/../outside.txt", jail.display()),
        ] {
            let out = fx.send_n_then_word(Opcode::REMOVE, &every(&way));
            fx.all(&out, MINUS_ONE, &way);
            refused += 1;
        }
        let out = fx.rename(&every("inside.txt"), &every("../stolen.txt"));
        fx.all(&out, MINUS_ONE, "rename out");
        let out = fx.rename(&every(&outside), &every("mine.txt"));
        fx.all(&out, MINUS_ONE, "rename in from outside");
        refused += 2;
        assert!(outside.exists() && !fx.path("stolen.txt").exists());
        assert!(!jail.join("mine.txt").exists());
        // Each lane renames its own file, then removes it; odd lanes have none: -1, an
        // ordinary C result, not a refusal.
        let old = per_lane(name);
        let new = per_lane(|l| format!("sub/{}", name(l)));
        let renamed = fx.rename(&old, &new);
        for l in fx.lanes() {
            let want = if l % 2 == 0 { 0 } else { MINUS_ONE };
            assert_eq!(renamed[l as usize], want, "lane {l} renames");
        }
        let removed = fx.send_n_then_word(Opcode::REMOVE, &new);
        for l in fx.lanes() {
            let want = if l % 2 == 0 { 0 } else { MINUS_ONE };
            assert_eq!(removed[l as usize], want, "lane {l} removes");
            assert!(!jail.join(format!("sub/{}", name(l))).exists());
        }
        assert_eq!(fx.settled().refused, refused);
    }
}

/// What is never opened, even under `Allow`: a FIFO nobody writes is refused at once (the
/// client's wait would give up if the server blocked on it), a directory, `/dev/zero`, and a
/// protected file in any mode (a refused "w" leaves it whole), which REMOVE and RENAME do not
/// touch either; `/dev/null` opens.
#[test]
fn fifos_directories_devices_and_protected_files_are_refused() {
    for fx in Fx::each("special") {
        let fifo = fx.path("fifo");
        let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
        let mut refused = 0;
        for mode in ["r", "r+", "w", "a"] {
            fx.all(&fx.fopen(&every(&fifo), mode), 0, "a FIFO");
            refused += 1;
        }
        fx.all(&fx.fopen(&every(&fx.dir), "r"), 0, "a directory");
        fx.all(&fx.fopen(&every("/dev/zero"), "r"), 0, "/dev/zero");
        fx.all(
            &fx.fopen(&every("/dev/rpc-new"), "w"),
            0,
            "a new file in /dev",
        );
        refused += 3;
        assert!(!Path::new("/dev/rpc-new").exists());

        let null = fx.fopen(&every("/dev/null"), "w");
        for l in fx.lanes() {
            assert_ne!(null[l as usize], 0, "lane {l}: /dev/null opens");
        }
        let written = fx.write_to_stream(&null, &vec![b"gone".to_vec(); 64]);
        fx.all(&written, 4, "written to /dev/null");
        fx.on_handles(Opcode::CLOSE_FILE, &null);

        let mailbox = fx.path("mailbox");
        std::fs::write(&mailbox, "the mailbox").unwrap();
        std::fs::hard_link(&mailbox, fx.path("alias")).unwrap();
        std::fs::write(fx.path("other"), "other").unwrap();
        fx.services().protect_file(&mailbox).unwrap();
        for name in ["mailbox", "alias"] {
            let path = fx.path(name);
            for mode in ["r", "r+", "w", "a"] {
                fx.all(&fx.fopen(&every(&path), mode), 0, name);
                refused += 1;
            }
            let out = fx.send_n_then_word(Opcode::REMOVE, &every(&path));
            fx.all(&out, MINUS_ONE, "remove");
            let out = fx.rename(&every(&path), &every(fx.path("moved")));
            fx.all(&out, MINUS_ONE, "rename away");
            let out = fx.rename(&every(fx.path("other")), &every(&path));
            fx.all(&out, MINUS_ONE, "rename over");
            refused += 3;
        }
        assert_eq!(std::fs::read_to_string(&mailbox).unwrap(), "the mailbox");
        assert!(fx.path("other").exists() && !fx.path("moved").exists());
        fx.expect_settled(refused);
    }
}

/// The sandbox is held by its descriptor, not its name: once the policy is set, a local
/// process renames the sandbox's directory and puts a symbolic link to another directory at
/// its old path. OPEN_FILE (reading, creating, truncating), REMOVE and RENAME, by relative
/// paths and by absolute ones under the old path, then act in the renamed directory, and the
/// directory the link points to is untouched. (When the sandbox was looked up by its path for
/// each request, the device read `secret.txt` and wrote, removed and renamed files there.)
#[test]
fn a_renamed_sandbox_replaced_by_a_link_keeps_requests_inside_the_renamed_directory() {
    for fx in Fx::each("renamed") {
        let jail = fx.path("jail");
        let moved = fx.path("moved");
        let elsewhere = fx.path("elsewhere");
        std::fs::create_dir_all(&jail).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::write(jail.join("inside.txt"), "ok").unwrap();
        for name in ["secret.txt", "victim.txt", "inside.txt"] {
            std::fs::write(elsewhere.join(name), "secret").unwrap();
        }
        fx.services()
            .set_file_policy(FilePolicy::Sandbox(jail.clone()));

        std::fs::rename(&jail, &moved).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &jail).unwrap();

        // Reading: the renamed directory's file, by a relative and an absolute path.
        for path in [
            Path::new("inside.txt").to_path_buf(),
            jail.join("inside.txt"),
        ] {
            let handles = fx.fopen(&every(&path), "r");
            let read = fx.fread(10, &handles).0;
            for l in fx.lanes() {
                assert_eq!(read[l as usize], b"ok", "lane {l}: {}", path.display());
            }
            fx.on_handles(Opcode::CLOSE_FILE, &handles);
        }
        // What only the other directory has is not there.
        fx.all(&fx.fopen(&every("secret.txt"), "r"), 0, "secret.txt");
        // Creating (a file per lane) and truncating: in the renamed directory.
        let new = |l: u32| format!("new{l}.txt");
        for paths in [per_lane(new), every("secret.txt")] {
            let handles = fx.fopen(&paths, "w");
            fx.write_to_stream(&handles, &vec![b"mine".to_vec(); 64]);
            fx.on_handles(Opcode::CLOSE_FILE, &handles);
        }
        assert_eq!(std::fs::read(moved.join("secret.txt")).unwrap(), b"mine");
        // REMOVE and RENAME: nothing there to remove; the renames are the renamed directory's.
        let out = fx.send_n_then_word(Opcode::REMOVE, &every("victim.txt"));
        fx.all(&out, MINUS_ONE, "victim.txt is not in the sandbox");
        let old = per_lane(|l| jail.join(new(l)).display().to_string());
        let out = fx.rename(&old, &per_lane(|l| format!("renamed{l}.txt")));
        fx.all(&out, 0, "the rename inside");
        for l in fx.lanes() {
            assert_eq!(
                std::fs::read(moved.join(format!("renamed{l}.txt"))).unwrap(),
                b"mine"
            );
            assert!(!moved.join(new(l)).exists());
        }

        for name in ["secret.txt", "victim.txt", "inside.txt"] {
            assert_eq!(
                std::fs::read_to_string(elsewhere.join(name)).unwrap(),
                "secret",
                "{name} outside"
            );
        }
        let outside: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
        assert_eq!(outside.len(), 3, "nothing created outside");
        assert_eq!(fx.settled().refused, 0);
    }
}
