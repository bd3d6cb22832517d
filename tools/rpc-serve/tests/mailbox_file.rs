//! `--file PATH`: one rpc-serve per mailbox file, and no user file destroyed. A second server
//! on a live mailbox refuses (status 3); a symbolic link at the path, a file that is not an
//! idle mailbox of the layout and a FIFO are refused and left untouched (status 4); only a file
//! rpc-serve created is removed at exit; two servers started at once leave one serving.

mod common;

use std::io::BufReader;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{increment, layout, scratch, serve, wait_exit, Killing, PORTS};

/// How long a refusal may take before the test fails instead of hanging (a server that did
/// not refuse serves until it is killed).
const GUARD: Duration = Duration::from_secs(30);

/// rpc-serve with the test layout and `args`, which must exit by itself: its status and stderr.
fn refused(args: &[&str]) -> (ExitStatus, String) {
    let mut child = Killing(
        Command::new(env!("CARGO_BIN_EXE_rpc-serve"))
            .args(["--gen", "v2", "--ports", &PORTS.to_string(), "--lanes", "1"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = child.0.stderr.take().unwrap();
    let log = common::log_lines(stderr);
    let status = wait_exit(&mut child.0, GUARD);
    (status, log.iter().collect::<Vec<_>>().join("\n"))
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// rpc-serve on `--file path` (and `more`) answers an increment of `x` there, then stops.
fn serve_an_increment(path: &Path, more: &[&str], x: u64) {
    let mut args = vec!["--file", arg(path)];
    args.extend_from_slice(more);
    let serving = serve(&args, None);
    assert_eq!(increment(&common::map(path), x), x + 1);
    serving.stop();
}

/// rpc-serve with `args` is refused with `code`, saying `why`.
fn refused_saying(args: &[&str], code: i32, why: &str) {
    let (status, log) = refused(args);
    assert_eq!(status.code(), Some(code), "{args:?}: {log}");
    assert!(log.contains(why), "{log}");
}

/// `--file path` is refused with `code`, saying `why`, with `--replace` as without.
fn refused_even_with_replace(path: &Path, code: i32, why: &str) {
    refused_saying(&["--file", arg(path)], code, why);
    refused_saying(&["--file", arg(path), "--replace"], code, why);
}

#[test]
fn an_existing_file_that_is_not_an_idle_mailbox_is_refused_and_left_byte_for_byte() {
    let dir = scratch("precious");
    let precious = dir.join("precious.txt");
    std::fs::write(&precious, b"precious words\n").unwrap();
    // Exactly a mailbox's size, but words no idle mailbox has.
    let sized = dir.join("sized");
    let garbage = vec![0xa5; layout().total_size()];
    std::fs::write(&sized, &garbage).unwrap();
    // A FIFO: refused at once, not waited on.
    let fifo = dir.join("fifo");
    common::mkfifo(&fifo);
    for (path, why) in [
        (&precious, "not an idle mailbox"),
        (&sized, "not an idle mailbox"),
        (&fifo, "not a regular file"),
    ] {
        refused_saying(&["--file", arg(path)], 4, why);
    }
    assert!(refused(&["--file", arg(&precious)]).1.contains("--replace"));
    assert_eq!(std::fs::read(&precious).unwrap(), b"precious words\n");
    assert_eq!(std::fs::read(&sized).unwrap(), garbage);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_symbolic_link_at_the_path_is_refused_and_its_target_untouched() {
    let dir = scratch("symlink");
    let target = dir.join("target.txt");
    std::fs::write(&target, b"the target\n").unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    // A link to an idle mailbox is not followed either.
    let mailbox = dir.join("idle-mailbox");
    std::fs::write(&mailbox, vec![0; layout().total_size()]).unwrap();
    let to_mailbox = dir.join("to-mailbox");
    std::os::unix::fs::symlink(&mailbox, &to_mailbox).unwrap();
    // A dangling link: its target must not be created.
    let missing = dir.join("missing");
    let dangling = dir.join("dangling");
    std::os::unix::fs::symlink(&missing, &dangling).unwrap();
    for path in [&link, &to_mailbox, &dangling] {
        refused_even_with_replace(path, 4, "symbolic link");
        assert!(path.symlink_metadata().unwrap().is_symlink());
    }
    assert_eq!(std::fs::read(&target).unwrap(), b"the target\n");
    assert_eq!(
        std::fs::read(&mailbox).unwrap(),
        vec![0; layout().total_size()]
    );
    assert!(!missing.exists(), "a dangling link's target was created");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_second_server_on_a_live_mailbox_file_refuses_and_the_first_serves_on() {
    let dir = scratch("second");
    let file = dir.join("mailbox");
    let first = serve(&["--file", arg(&file)], None);
    refused_even_with_replace(&file, 3, "another rpc-serve");
    // The refused servers neither removed nor touched the file.
    let map = common::map(&file);
    assert_eq!(increment(&map, 1), 2);
    drop(map);
    first.stop();
    assert!(
        !file.exists(),
        "the first server removes the file it created"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn only_a_file_rpc_serve_created_is_removed_at_exit() {
    let dir = scratch("created");
    // Created by rpc-serve: removed.
    let fresh = dir.join("fresh");
    serve_an_increment(&fresh, &[], 1);
    assert!(!fresh.exists());
    // An idle mailbox it was given (a fresh one is all zero): served as it is, kept.
    let given = dir.join("given");
    std::fs::write(&given, vec![0; layout().total_size()]).unwrap();
    serve_an_increment(&given, &[], 3);
    assert_eq!(
        std::fs::metadata(&given).unwrap().len(),
        layout().total_size() as u64,
        "the given mailbox is kept"
    );
    // A user file overwritten with --replace: the user asked for it, and it is kept too.
    let replaced = dir.join("replaced.txt");
    std::fs::write(&replaced, b"old contents\n").unwrap();
    serve_an_increment(&replaced, &["--replace"], 5);
    assert_eq!(
        std::fs::metadata(&replaced).unwrap().len(),
        layout().total_size() as u64,
        "the replaced file is kept"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two rpc-serves started at once on a new path, 20 times: exactly one serves it, the other
/// finds it locked and exits 3, and the file goes with the server. (Where the file system has
/// no `O_TMPFILE` the file is created before it is locked, and the loser may find it empty
/// first: status 4 then.)
#[test]
fn two_servers_started_at_once_on_a_new_path_leave_exactly_one_serving() {
    let dir = scratch("race");
    let tmpfile = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(&dir)
        .is_ok();
    let losing = if tmpfile { &[3][..] } else { &[3, 4][..] };
    for round in 0..20 {
        let file = dir.join(format!("mailbox-{round}"));
        let start = || {
            Killing(
                Command::new(env!("CARGO_BIN_EXE_rpc-serve"))
                    .args(["--gen", "v2", "--ports", &PORTS.to_string(), "--lanes", "1"])
                    .args(["--file", arg(&file)])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            )
        };
        let mut pair = [start(), start()];
        let deadline = Instant::now() + GUARD;
        let (loser, status) = loop {
            let exited = pair
                .iter_mut()
                .enumerate()
                .find_map(|(i, child)| Some((i, child.0.try_wait().unwrap()?)));
            if let Some(exited) = exited {
                break exited;
            }
            assert!(Instant::now() < deadline, "round {round}: neither refused");
            std::thread::sleep(Duration::from_millis(5));
        };
        let log = common::log_lines(pair[loser].0.stderr.take().unwrap());
        let log: Vec<String> = log.iter().collect();
        assert!(
            status.code().is_some_and(|code| losing.contains(&code)),
            "round {round}: {status}; {log:?}"
        );
        let winner = &mut pair[1 - loser];
        // Kept open to the end: a closed stdout would make the statistics lost output (5).
        let mut stdout = BufReader::new(winner.0.stdout.take().unwrap());
        let (path, _) = common::read_ready(&mut stdout);
        assert_eq!(path, file);
        assert_eq!(increment(&common::map(&file), 7), 8);
        common::sigterm(&winner.0);
        assert_eq!(wait_exit(&mut winner.0, GUARD).code(), Some(0));
        assert!(
            !file.exists(),
            "round {round}: the file outlived its server"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
