//! `rpc-serve` in a child process, the rpc-core client in this one, over the shared file.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use plugin_host::kernel::{STDIN, STDOUT};
use plugin_host::{Arg, Target, Warp};
use rpc_core::protocol::{Generation, Layout, LockTable};
use rpc_core::Opcode;

struct Served {
    child: Child,
    stdout: BufReader<std::process::ChildStdout>,
    dir: PathBuf,
    map: memmap2::MmapMut,
    layout: Layout,
    locks: LockTable,
    stopped: bool,
}

impl Drop for Served {
    fn drop(&mut self) {
        if !self.stopped {
            // A failed test must not leave the server running (it holds our output pipes).
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn serve(generation: Generation, ports: u32, lanes: u32, tag: &str) -> Served {
    serve_with(generation, ports, lanes, tag, &[])
}

fn serve_with(generation: Generation, ports: u32, lanes: u32, tag: &str, extra: &[&str]) -> Served {
    let dir = std::env::temp_dir().join(format!("rpc-serve-test-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("mailbox");
    let mut child = Command::new(env!("CARGO_BIN_EXE_rpc-serve"))
        .args([
            "--file",
            file.to_str().unwrap(),
            "--gen",
            &generation.to_string(),
        ])
        .args(["--ports", &ports.to_string(), "--lanes", &lanes.to_string()])
        .args(["--stdout", dir.join("out.txt").to_str().unwrap()])
        .args(extra)
        // The files the tests open lie in `dir`: rpc-serve's default sandbox is its working
        // directory.
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let layout = Layout::new(generation, ports, lanes).unwrap();
    assert_eq!(
        line,
        format!("ready {} {}\n", file.display(), layout.total_size())
    );
    let map = common::map(&file);
    Served {
        child,
        stdout,
        dir,
        map,
        layout,
        locks: LockTable::new(ports),
        stopped: false,
    }
}

impl Served {
    fn warp(&self, mask: u64) -> Warp<'_> {
        common::warp(&self.map, self.layout, &self.locks, None, mask)
    }

    /// SIGTERM, then the exit status and the rest of stdout.
    fn stop(mut self) -> String {
        common::sigterm(&self.child);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "rpc-serve exited with {status}");
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        let out = std::fs::read_to_string(self.dir.join("out.txt")).unwrap();
        assert!(
            !self.dir.join("mailbox").exists(),
            "rpc-serve leaves no mailbox file behind"
        );
        std::fs::remove_dir_all(&self.dir).unwrap();
        self.stopped = true;
        format!("{rest}---\n{out}")
    }
}

#[test]
fn rpc_serve_serves_another_process_for_v1_v2_and_l_1_32() {
    for generation in [Generation::V1, Generation::V2] {
        for lanes in [1u32, 32] {
            let served = serve(generation, 16, lanes, &format!("{generation}-{lanes}"));
            let mask = if lanes == 1 { 1 } else { 0x8000_0003 };
            let warp = served.warp(mask);
            let got = warp
                .call(Opcode::TEST_INCREMENT, |l| 100 + u64::from(l))
                .unwrap();
            for lane in warp.lanes() {
                assert_eq!(got[lane as usize], 101 + u64::from(lane));
            }
            // TEST_STREAM of 1 MiB per lane.
            let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + 3) as u8).collect();
            let mut port = warp.open(Opcode::TEST_STREAM).unwrap();
            port.send_n(&vec![data.as_slice(); 32]).unwrap();
            let back = port.recv_n(2 << 20).unwrap();
            drop(port);
            for lane in warp.lanes() {
                assert!(back[lane as usize] == data, "lane {lane}");
            }
            let printed = warp
                .printf("%s %d %5.2f|\n", |l| {
                    vec![Arg::Str(Some("lane")), Arg::Int(l.into()), Arg::Double(1.5)]
                })
                .unwrap();
            for lane in warp.lanes() {
                assert_eq!(
                    printed[lane as usize],
                    format!("lane {lane}  1.50|\n").len() as i64
                );
            }
            // File I/O through the server, from one lane (each lane's fopen opens its own FILE).
            let warp = served.warp(1);
            let path = served.dir.join("data.txt").to_string_lossy().into_owned();
            let handle = warp.fopen(|_| path.clone(), "w+").unwrap()[0];
            assert_ne!(handle, 0);
            warp.write(Target::File(handle), |l| format!("line {l}\n").into_bytes())
                .unwrap();
            warp.fclose(|_| handle).unwrap();
            let handle = warp.fopen(|_| path.clone(), "r").unwrap()[0];
            let read = warp.fread(|_| handle, 1000).unwrap();
            let expected: String = warp.lanes().map(|l| format!("line {l}\n")).collect();
            assert_eq!(String::from_utf8_lossy(&read[0]), expected);
            warp.fclose(|_| handle).unwrap();
            assert_eq!(
                warp.fread(|_| STDIN, 0).unwrap()[0],
                b"",
                "reading 0 bytes of stdin"
            );
            let _ = STDOUT;
            let report = served.stop();
            assert!(report.contains("stopped: served="), "{report}");
            let lines = warp_lines(mask);
            assert!(report.ends_with(&lines), "{report}");
        }
    }
}

#[test]
fn rpc_serve_prints_its_statistics_as_json_with_json() {
    let served = serve_with(Generation::V1, 4, 1, "json", &["--json"]);
    let warp = served.warp(1);
    for i in 0..3 {
        assert_eq!(warp.call(Opcode::TEST_INCREMENT, |_| i).unwrap()[0], i + 1);
    }
    let report = served.stop();
    let line = report.lines().next().unwrap();
    let stats: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(stats["served"]["TEST_INCREMENT"], 3, "{line}");
    assert_eq!(stats["total_served"], 3, "{line}");
    for counter in ["errors", "refused", "panics", "abandoned"] {
        assert_eq!(stats[counter], 0, "{counter} in {line}");
    }
    assert!(stats["passes"].as_u64().unwrap() > 0, "{line}");
}

fn warp_lines(mask: u64) -> String {
    rpc_core::protocol::lanes(mask)
        .map(|l| format!("lane {l}  1.50|\n"))
        .collect()
}

#[test]
fn rpc_serve_rejects_bad_arguments_with_exit_code_2() {
    let bad: [&[&str]; 6] = [
        &["--gen", "v3", "--file", "x", "--ports", "1", "--lanes", "1"],
        &[
            "--gen",
            "v1",
            "--file",
            "x",
            "--ports",
            "4",
            "--lanes",
            "1",
            "--files",
            "/nonexistent/rpc-serve-sandbox",
        ],
        &["--gen", "v1", "--file", "x", "--ports", "0", "--lanes", "1"],
        &[
            "--gen", "v1", "--file", "x", "--ports", "4", "--lanes", "16",
        ],
        &["--file", "x", "--ports", "4", "--lanes", "1"],
        // Without --file the mailbox is a memfd: asking for both is a contradiction.
        &[
            "--memfd", "--gen", "v1", "--file", "x", "--ports", "4", "--lanes", "1",
        ],
    ];
    for args in bad {
        let output = Command::new(env!("CARGO_BIN_EXE_rpc-serve"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.starts_with("error: "), "{message}");
        assert!(message.contains("--help"), "{message}");
        assert!(output.stdout.is_empty());
    }
}

#[test]
fn rpc_serve_dispatch_tests_answers_typed_calls_from_another_process() {
    use rpc_core::protocol::CallArg;
    use rpc_core::services::dispatch_tests::opcode;
    let served = serve_with(Generation::V2, 4, 32, "dispatch", &["--dispatch-tests"]);
    let warp = served.warp(0x8000_0003);
    let mut args: Vec<Vec<CallArg<'_>>> = (0..64u32)
        .map(|l| vec![CallArg::value(u64::from(l) << 33), CallArg::value(7u32)])
        .collect();
    let got = warp.dispatch(opcode(0), &mut args, 8).unwrap();
    for lane in warp.lanes() {
        let want = (u64::from(lane) << 33) + 7;
        assert_eq!(got[lane as usize], want.to_le_bytes(), "add, lane {lane}");
    }
    let mut texts: Vec<Vec<u8>> = (0..64usize)
        .map(|l| format!("{l:>width$}\0", width = l).into_bytes())
        .collect();
    let mut args: Vec<Vec<CallArg<'_>>> = texts
        .iter_mut()
        .map(|t| vec![CallArg::Pointer(Some(&mut t[..]))])
        .collect();
    let got = warp.dispatch(opcode(2), &mut args, 8).unwrap();
    for lane in warp.lanes() {
        let want = format!("{lane:>width$}", width = lane as usize).len() as u64;
        assert_eq!(
            got[lane as usize],
            want.to_le_bytes(),
            "length, lane {lane}"
        );
    }
    let report = served.stop();
    assert!(report.contains("refused=0"), "{report}");
}
