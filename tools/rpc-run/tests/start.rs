//! LLVM's start protocol run by `rpc-run`'s library: on plugin-host's CPU device (kernels as
//! Rust closures over the real mailbox) and on plugin-cuda over its fake driver.

use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use plugin_host::{Arg, HostConfig, HostImage, HostPlugin, Warp};
use rpc_core::plugin::Grid;
use rpc_core::protocol::Generation;
use rpc_core::protocol::Numbering;
use rpc_core::{ExitPolicy, ServerConfig, ServicesConfig};
use rpc_core::{PluginRuntime, Runtime};
use rpc_run::start::{self, Program};
use rpc_run::Failure;

fn word(args: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(args[at..at + 8].try_into().unwrap())
}

/// The strings of a null-terminated `char **` table in the (host) device's memory.
fn strings(table: u64) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0.. {
        // SAFETY: the host device's addresses are host addresses; `table` is the start block
        // rpc-run wrote before the launch and keeps until the program ends, ending in null.
        let entry = unsafe { *((table as *const u64).add(i)) };
        if entry == 0 {
            break;
        }
        // SAFETY: each entry points at a NUL-terminated string in the same block.
        out.push(
            unsafe { CStr::from_ptr(entry as *const c_char) }
                .to_string_lossy()
                .into_owned(),
        );
    }
    out
}

fn record_runtime(lanes: u32) -> PluginRuntime<HostPlugin> {
    let config = ServerConfig {
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            ..ServicesConfig::default()
        },
        ..ServerConfig::default()
    };
    PluginRuntime::new(
        HostPlugin::new(HostConfig {
            devices: 1,
            lanes,
            ports: 8,
        }),
        config,
    )
    .unwrap()
}

type Log = Arc<Mutex<Vec<String>>>;

/// An image whose `main` checks its arguments, prints, and returns `status` on every thread.
fn program_image(log: &Log, status: i32) -> Vec<u8> {
    let (begin, start, end) = (log.clone(), log.clone(), log.clone());
    HostImage::new("program")
        .generation(Generation::V1)
        .kernel("_begin", move |w: &mut Warp<'_>| {
            let args = w.args();
            let argc = i32::from_le_bytes(args[0..4].try_into().unwrap());
            begin.lock().unwrap().push(format!(
                "_begin argc={argc} argv={:?} lanes={:#x}",
                strings(word(args, 8)),
                w.mask()
            ));
        })
        .kernel("_start", move |w: &mut Warp<'_>| {
            let args = w.args();
            let env = strings(word(args, 16));
            start.lock().unwrap().push(format!(
                "_start argc={} argv={:?} env_has_K={}",
                i32::from_le_bytes(args[0..4].try_into().unwrap()),
                strings(word(args, 8)),
                env.iter().any(|e| e == "K=V")
            ));
            w.printf("main on warp %d\n", |_| {
                vec![Arg::Int(w.global_warp() as i64)]
            })
            .unwrap();
            // SAFETY: `ret` is the int in the start block, 8-byte aligned, alive until the end.
            let ret = unsafe { AtomicI32::from_ptr(word(args, 24) as *mut i32) };
            // As LLVM's _start: every thread ors main's result in.
            ret.fetch_or(status, Ordering::Relaxed);
        })
        .kernel("_end", move |w: &mut Warp<'_>| {
            end.lock()
                .unwrap()
                .push(format!("_end args={}", w.args().len()));
        })
        .into_bytes()
}

fn program() -> Program {
    Program {
        args: vec!["prog.img".into(), "one".into(), "two".into()],
        env: vec!["K=V".into()],
    }
}

/// [`program`] run from `image` on `device` (no constructors).
fn run_program(
    runtime: &dyn Runtime,
    device: usize,
    image: &[u8],
    numbering: Numbering,
    grid: Grid,
) -> Result<i32, Failure> {
    start::run(runtime, device, image, numbering, &[], &program(), grid)
}

#[test]
fn begin_on_one_thread_start_on_the_grid_end_then_mains_status() {
    let log = Log::default();
    let runtime = record_runtime(32);
    let image = program_image(&log, 5);
    let status = run_program(&runtime, 0, &image, Numbering::Current, Grid::linear(2, 64)).unwrap();
    assert_eq!(status, 5);
    let log = log.lock().unwrap().clone();
    let argv = r#"["prog.img", "one", "two"]"#;
    assert_eq!(log[0], format!("_begin argc=3 argv={argv} lanes=0x1"));
    // 2 blocks of 64 threads at 32 lanes: 4 warps.
    assert_eq!(log.len(), 1 + 4 + 1, "{log:?}");
    for line in &log[1..5] {
        assert_eq!(line, &format!("_start argc=3 argv={argv} env_has_K=true"));
    }
    assert_eq!(log[5], "_end args=0", "LLVM 20+: _end()");
}

#[test]
fn an_llvm19_image_gets_the_status_in_end() {
    let log = Log::default();
    let runtime = record_runtime(1);
    let image = program_image(&log, 2);
    let status = run_program(&runtime, 0, &image, Numbering::Llvm19, Grid::linear(1, 1));
    assert_eq!(status, Ok(2));
    assert_eq!(log.lock().unwrap().last().unwrap(), "_end args=4");
}

#[test]
fn a_kernels_exit_ends_the_program_with_its_status_and_exit_0_is_no_error() {
    for status in [3, 0] {
        let runtime = record_runtime(32);
        let image = HostImage::new("exits")
            .kernel("_begin", |_: &mut Warp<'_>| {})
            .kernel("_start", move |w: &mut Warp<'_>| {
                w.puts(|_| "before exit".into()).unwrap();
                w.exit(status)
            })
            .kernel("_end", |_: &mut Warp<'_>| {
                panic!("_end must not run after exit")
            })
            .into_bytes();
        let got = run_program(&runtime, 0, &image, Numbering::Current, Grid::linear(1, 32));
        assert_eq!(got, Ok(status));
    }
}

#[test]
fn a_faulting_kernel_and_a_missing_device_are_their_own_failures() {
    let runtime = record_runtime(32);
    let image = HostImage::new("faults")
        .kernel("_begin", |_: &mut Warp<'_>| panic!("illegal address"))
        .into_bytes();
    let failure =
        run_program(&runtime, 0, &image, Numbering::Current, Grid::linear(1, 1)).unwrap_err();
    assert_eq!(failure.code(), rpc_run::code::KERNEL_FAULT, "{failure}");
    let failure =
        run_program(&runtime, 3, &image, Numbering::Current, Grid::linear(1, 1)).unwrap_err();
    assert_eq!(failure.code(), rpc_run::code::NO_DEVICE, "{failure}");
    let missing = HostImage::new("no start").into_bytes();
    let failure = run_program(
        &runtime,
        0,
        &missing,
        Numbering::Current,
        Grid::linear(1, 1),
    )
    .unwrap_err();
    assert_eq!(failure.code(), rpc_run::code::KERNEL_FAULT, "{failure}");
    assert!(failure.to_string().contains("_begin"), "{failure}");
}

/// Under the process policy (rpc-run's), a kernel's `exit(3)` ends the process with 3 after
/// its output is flushed: checked in a child process running this same test binary.
#[test]
fn exit_3_makes_the_process_exit_3() {
    if std::env::var_os("RPC_RUN_EXIT_CHILD").is_some() {
        let runtime = PluginRuntime::new(
            HostPlugin::new(HostConfig::default()),
            ServerConfig::default(),
        )
        .unwrap();
        let image = HostImage::new("exit3")
            .kernel("_begin", |_: &mut Warp<'_>| {})
            .kernel("_start", |w: &mut Warp<'_>| {
                w.printf("exiting with %d\n", |_| vec![Arg::Int(3)])
                    .unwrap();
                w.exit(3)
            })
            .kernel("_end", |_: &mut Warp<'_>| {})
            .into_bytes();
        let _ = run_program(&runtime, 0, &image, Numbering::Current, Grid::linear(1, 1));
        unreachable!("exit(3) ends the process");
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "exit_3_makes_the_process_exit_3", "--nocapture"])
        .env("RPC_RUN_EXIT_CHILD", "1")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("exiting with 3\n"),
        "flushed before exit: {stdout}"
    );
}

mod cuda_fake {
    //! The CUDA path over plugin-cuda's fake driver: its kernels do not run, so this checks
    //! what rpc-run asks of the driver: the stack limit, the three launches and the start
    //! block.
    use super::*;
    use plugin_cuda::fake::{FakeDriver, FakeGpu};
    use plugin_cuda::CudaPlugin;

    const IMAGE: &[u8] =
        b".entry _begin\n.entry _start\n.entry _end\n.global __llvm_rpc_client 552\n\0";

    #[test]
    fn the_stack_limit_the_launch_sequence_and_argv_in_device_memory() {
        let driver = Arc::new(FakeDriver::new(vec![FakeGpu::h200()]));
        let runtime = rpc_run::runtime(CudaPlugin::with_driver(driver.clone()), false).unwrap();
        rpc_run::prepare_cuda(&runtime, 0).unwrap();
        assert_eq!(driver.stack_limit(), Some(3 * 1024));
        let grid = Grid {
            blocks: [4, 1, 1],
            threads: [32, 2, 1],
        };
        let status = run_program(&runtime, 0, IMAGE, Numbering::Current, grid).unwrap();
        assert_eq!(status, 0, "nothing ran, so *ret stayed 0");
        let launches = driver.launches();
        let names: Vec<&str> = launches.iter().map(|l| l.kernel.as_str()).collect();
        assert_eq!(names, ["_begin", "_start", "_end"]);
        assert_eq!(launches[0].grid, Grid::linear(1, 1));
        assert_eq!(launches[1].grid, grid);
        assert_eq!(launches[2].grid, Grid::linear(1, 1));
        assert_eq!(launches[0].args.len(), 24);
        assert_eq!(launches[1].args.len(), 32);
        assert!(launches[2].args.is_empty());
        assert_eq!(&launches[0].args[..4], &3i32.to_le_bytes());
        assert_eq!(&launches[1].args[..24], &launches[0].args[..]);
        let argv = word(&launches[1].args, 8);
        let ret = word(&launches[1].args, 24);
        let block = driver
            .memory_at(argv)
            .expect("the start block was copied to the device");
        let strings_at = (ret - argv) as usize + 8;
        assert_eq!(&block[strings_at..strings_at + 17], b"prog.img\0one\0two\0");
    }

    #[test]
    fn no_gpu_is_a_no_device_failure() {
        let driver = Arc::new(FakeDriver::new(vec![]));
        let runtime = rpc_run::runtime(CudaPlugin::with_driver(driver), false).unwrap();
        rpc_run::prepare_cuda(&runtime, 0).unwrap();
        let failure =
            run_program(&runtime, 0, IMAGE, Numbering::Current, Grid::linear(1, 1)).unwrap_err();
        assert_eq!(failure.code(), rpc_run::code::NO_DEVICE, "{failure}");
    }
}
