//! plugin-host through the real plugin path: images, mailboxes, launches, user guards.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plugin_contract::Capture;
use plugin_host::{Arg, HostConfig, HostImage, HostPlugin, Target};
use rpc_core::plugin::{Device, Grid, Plugin};
use rpc_core::protocol::{CallArg, Generation};
use rpc_core::KernelExit;
use rpc_core::{Error, Opcode, PluginError, ServerError};
use rpc_core::{PluginRuntime, Runtime};

fn runtime(config: HostConfig) -> (PluginRuntime<HostPlugin>, Capture) {
    plugin_contract::runtime_capturing_stdout(HostPlugin::new(config))
}

fn hello_image() -> Vec<u8> {
    HostImage::new("hello")
        .kernel("hello", |warp| {
            let w = warp.global_warp();
            warp.printf("warp %d lane %2d: %s\n", |lane| {
                vec![
                    Arg::Int(w.into()),
                    Arg::Int(lane.into()),
                    Arg::Str(Some("hello")),
                ]
            })
            .unwrap();
        })
        .into_bytes()
}

/// Loads `bytes` on device 0 and runs its kernel `k` on two blocks of 100 threads: the last
/// warp of each block is partial.
fn run_k_on_partial_warps(runtime: &PluginRuntime<HostPlugin>, bytes: &[u8]) {
    let image = runtime.load_image(0, bytes).unwrap();
    runtime
        .launch(image, "k", &[], Grid::linear(2, 100))
        .unwrap();
    runtime.synchronize(0).unwrap();
}

#[test]
fn four_devices_one_server_thread_and_deinit_twice() {
    let (mut runtime, out) = runtime(HostConfig {
        devices: 4,
        lanes: 32,
        ports: 16,
    });
    let bytes = hello_image();
    let images: Vec<_> = (0..4)
        .map(|d| runtime.load_image(d, &bytes).unwrap())
        .collect();
    assert!(images.iter().all(|&i| runtime.mailbox(i).is_some()));
    assert_eq!(runtime.server().mailboxes().len(), 4);
    assert_eq!(
        runtime.server().stats().workers_started,
        1,
        "four attaches start one worker"
    );
    assert_eq!(runtime.server().stats().live_workers, 1);
    for (d, &image) in images.iter().enumerate() {
        runtime
            .launch(image, "hello", &[], Grid::linear(1, 64))
            .unwrap();
        runtime.synchronize(d).unwrap();
    }
    let text = out.text();
    assert_eq!(text.lines().count(), 4 * 64, "{text}");
    assert!(text.contains("warp 1 lane 31: hello\n"));
    runtime.deinit().unwrap();
    assert_eq!(runtime.server().stats().live_workers, 0);
    assert!(runtime.server().mailboxes().is_empty());
    runtime.deinit().unwrap();
}

/// Runtimes of different plugins (here two host plugins, a 32-lane and a 64-lane one) side by
/// side in one `Vec` through the object-safe `Runtime`, each with its own server.
#[test]
fn runtimes_held_as_dyn_runtime_each_serve_their_own_kernels() {
    let (narrow, narrow_out) = runtime(HostConfig {
        devices: 1,
        lanes: 32,
        ports: 8,
    });
    let (wide, wide_out) = runtime(HostConfig {
        devices: 2,
        lanes: 64,
        ports: 8,
    });
    let mut runtimes: Vec<Box<dyn Runtime>> = vec![Box::new(narrow), Box::new(wide)];
    let bytes = hello_image();
    for runtime in &runtimes {
        assert_eq!(runtime.plugin_name(), "host");
        assert_eq!(runtime.reason(), None);
        let image = runtime.load_image(0, &bytes).unwrap();
        assert!(runtime.mailbox(image).is_some());
        runtime
            .launch(image, "hello", &[], Grid::linear(1, 64))
            .unwrap();
        runtime.synchronize(0).unwrap();
    }
    assert_eq!(runtimes[1].device_count(), 2);
    assert_eq!(runtimes[1].device_name(1).as_deref(), Some("cpu1"));
    assert_eq!(runtimes[1].device_name(2), None);
    // 64 threads: two 32-lane warps on one, one 64-lane warp on the other; each server printed
    // only its own runtime's lines.
    assert_eq!(narrow_out.text().lines().count(), 64);
    assert!(narrow_out.text().contains("warp 1 lane 31: hello\n"));
    assert_eq!(wide_out.text().lines().count(), 64);
    assert!(wide_out.text().contains("warp 0 lane 63: hello\n"));
    for runtime in &mut runtimes {
        assert!(runtime.stats().total_served() > 0);
        plugin_contract::deinit_is_final(&mut **runtime);
    }
}

/// An image without RPC starts no server, and a warp's call there fails with the host
/// plugin's own error (no server was asked, so it is not the server's).
#[test]
fn an_image_without_the_client_symbol_starts_no_server() {
    let (runtime, _) = runtime(HostConfig::default());
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&errors);
    let bytes = HostImage::new("plain")
        .without_rpc()
        .kernel("k", move |warp| {
            let error = warp.call(Opcode::TEST_INCREMENT, |_| 1).unwrap_err();
            seen.lock().unwrap().push(error);
        })
        .into_bytes();
    let image = runtime.load_image(0, &bytes).unwrap();
    assert_eq!(runtime.mailbox(image), None);
    runtime
        .launch(image, "k", &[], Grid::linear(2, 32))
        .unwrap();
    runtime.synchronize(0).unwrap();
    assert_eq!(runtime.server().stats().workers_started, 0);
    assert!(!runtime.server().is_running());
    let errors = errors.lock().unwrap();
    assert_eq!(errors.len(), 2, "one call a warp");
    for error in errors.iter() {
        let Error::Plugin(PluginError::Vendor { plugin, source, .. }) = error else {
            panic!("{error:?}");
        };
        assert_eq!(*plugin, "host");
        assert!(
            matches!(
                source.get().downcast_ref::<plugin_host::HostError>(),
                Some(plugin_host::HostError::NoRpc)
            ),
            "{error:?}"
        );
    }
}

#[test]
fn v1_and_v2_images_and_every_lane_size() {
    for lanes in [1, 32, 64] {
        for generation in [Generation::V1, Generation::V2] {
            let (runtime, out) = runtime(HostConfig {
                devices: 1,
                lanes,
                ports: 8,
            });
            let bytes = HostImage::new("g")
                .generation(generation)
                .kernel("k", |warp| {
                    let got = warp
                        .call(Opcode::TEST_INCREMENT, |lane| u64::from(lane) * 10)
                        .unwrap();
                    for lane in warp.lanes() {
                        assert_eq!(got[lane as usize], u64::from(lane) * 10 + 1);
                    }
                    warp.puts(|lane| format!("lane {lane}")).unwrap();
                })
                .into_bytes();
            run_k_on_partial_warps(&runtime, &bytes);
            assert_eq!(out.text().lines().count(), 200, "{generation} L={lanes}");
        }
    }
}

#[test]
fn two_plugins_at_once_with_private_custom_opcodes() {
    let (nvidia, nv_out) = runtime(HostConfig {
        devices: 1,
        lanes: 32,
        ports: 32,
    });
    let (amd, amd_out) = runtime(HostConfig {
        devices: 1,
        lanes: 64,
        ports: 32,
    });
    let custom = Opcode::user(7);
    // The threads each server's handler ran on.
    let nv_threads = Arc::new(Mutex::new(HashSet::new()));
    let amd_threads = Arc::new(Mutex::new(HashSet::new()));
    let threads = nv_threads.clone();
    nvidia.server().register_packet(custom, move |_, p| {
        threads.lock().unwrap().insert(std::thread::current().id());
        p.set_word(0, 0x4E56)
    });
    let threads = amd_threads.clone();
    amd.server().register_packet(custom, move |_, p| {
        threads.lock().unwrap().insert(std::thread::current().id());
        p.set_word(0, 0x414D)
    });
    let image = |tag: &'static str| {
        HostImage::new(tag)
            .kernel("k", move |warp| {
                let mine = warp.call(custom, |_| 0).unwrap()[0];
                warp.printf("%s %x\n", |_| vec![Arg::Str(Some(tag)), Arg::UInt(mine)])
                    .unwrap();
            })
            .into_bytes()
    };
    let nv_image = nvidia.load_image(0, &image("nv")).unwrap();
    let amd_image = amd.load_image(0, &image("amd")).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            nvidia
                .launch(nv_image, "k", &[], Grid::linear(4, 64))
                .unwrap();
            nvidia.synchronize(0).unwrap();
        });
        s.spawn(|| {
            amd.launch(amd_image, "k", &[], Grid::linear(4, 128))
                .unwrap();
            amd.synchronize(0).unwrap();
        });
    });
    assert_eq!(
        nv_out.text().lines().filter(|l| *l == "nv 4e56").count(),
        4 * 64
    );
    assert_eq!(
        amd_out.text().lines().filter(|l| *l == "amd 414d").count(),
        4 * 128
    );
    // One worker each: every request of a server ran on its one worker, not the other's.
    let (nv_threads, amd_threads) = (nv_threads.lock().unwrap(), amd_threads.lock().unwrap());
    assert_eq!((nv_threads.len(), amd_threads.len()), (1, 1));
    assert!(nv_threads.is_disjoint(&amd_threads));
}

#[test]
fn a_kernel_that_panics_mid_request_fails_its_launch_and_the_next_one_works() {
    let (runtime, _) = runtime(HostConfig {
        devices: 1,
        lanes: 32,
        ports: 4,
    });
    let bytes = HostImage::new("crash")
        .kernel("crash", |warp| {
            let mut port = warp.open(Opcode::TEST_STREAM).unwrap();
            // The first packet of a 1000-byte stream, then the kernel dies.
            port.send(|_, p| p.set_word(0, 1000)).unwrap();
            panic!("kernel bug in the middle of a stream");
        })
        .kernel("ok", |warp| {
            let got = warp.call(Opcode::TEST_INCREMENT, |l| l.into()).unwrap();
            assert_eq!(got[3], 4);
        })
        .into_bytes();
    let image = runtime.load_image(0, &bytes).unwrap();
    runtime
        .launch(image, "crash", &[], Grid::linear(1, 32))
        .unwrap();
    let error = runtime.synchronize(0).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("kernel bug in the middle of a stream"),
        "{error}"
    );
    runtime
        .launch(image, "ok", &[], Grid::linear(2, 64))
        .unwrap();
    runtime.synchronize(0).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while runtime.server().stats().abandoned == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the dead exchange was abandoned"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn files_memory_exit_and_a_refused_request() {
    let (runtime, out) = runtime(HostConfig {
        devices: 1,
        lanes: 32,
        ports: 8,
    });
    let dir = std::env::temp_dir().join(format!("plugin-host-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("lanes.txt").to_string_lossy().into_owned();
    let bytes = HostImage::new("io")
        .kernel("io", move |warp| {
            let handle = warp.fopen(|_| path.clone(), "w+").unwrap()[0];
            assert_ne!(handle, 0);
            warp.fprintf(Target::File(handle), "lane %d\n", |l| {
                vec![Arg::Int(l.into())]
            })
            .unwrap();
            let size = warp
                .write(Target::File(handle), |_| b"end\n".to_vec())
                .unwrap();
            assert_eq!(size[0], 4);
            warp.fclose(|_| handle).unwrap();
            let handle = warp.fopen(|_| path.clone(), "r").unwrap()[0];
            let line = warp.fgets(|_| handle, 100).unwrap();
            assert_eq!(line[0].as_deref(), Some(&b"lane 0\n"[..]));
            warp.fclose(|_| handle).unwrap();
            let addr = warp.malloc(|_| 4096).unwrap();
            assert!(addr[0] != 0 && addr[0] % 4096 == 0, "aligned to its size");
            warp.free(|l| addr[l as usize]).unwrap();
            // Refused: a handle the host never handed out.
            let bad = warp.fclose(|_| 0x1234_0000).unwrap();
            assert_eq!(bad[0] as i32, -1);
            warp.exit(3);
        })
        .into_bytes();
    let image = runtime.load_image(0, &bytes).unwrap();
    runtime
        .launch(image, "io", &[], Grid::linear(1, 4))
        .unwrap();
    assert_eq!(runtime.synchronize(0), Ok(Some(KernelExit::Exit(3))));
    let contents = std::fs::read_to_string(dir.join("lanes.txt")).unwrap();
    assert_eq!(
        contents,
        "lane 0\nlane 1\nlane 2\nlane 3\nend\nend\nend\nend\n"
    );
    let stats = runtime.server().stats();
    assert!(stats.refused >= 1);
    assert_eq!(stats.served_of(Opcode::FREE), 1);
    assert!(runtime
        .server()
        .context()
        .services()
        .live_allocations()
        .is_empty());
    assert!(out.text().is_empty());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_v2_mailbox_rings_its_doorbell_and_the_worker_sleeps_on_it() {
    for generation in [Generation::V1, Generation::V2] {
        let (runtime, _) = runtime(HostConfig {
            devices: 1,
            lanes: 32,
            ports: 8,
        });
        // The kernel sends each request only once the test says so: with a doorbell, only once
        // the worker has gone to sleep on it (however long that takes on a loaded machine).
        let go = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let kernel_go = go.clone();
        let bytes = HostImage::new("bell")
            .generation(generation)
            .kernel("k", move |warp| {
                for round in 0..3u64 {
                    while kernel_go.load(std::sync::atomic::Ordering::Acquire) <= round {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let got = warp.call(Opcode::TEST_INCREMENT, |_| round).unwrap();
                    assert_eq!(got[0], round + 1);
                }
            })
            .into_bytes();
        let image = runtime.load_image(0, &bytes).unwrap();
        runtime
            .launch(image, "k", &[], Grid::linear(1, 32))
            .unwrap();
        for round in 0..3u64 {
            if generation == Generation::V2 {
                // Silence, no request open: the worker sleeps on the doorbell.
                let slept = runtime.server().stats().doorbell_sleeps;
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while runtime.server().stats().doorbell_sleeps == slept {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "never slept on the bell"
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            go.store(round + 1, std::sync::atomic::Ordering::Release);
        }
        runtime.synchronize(0).unwrap();
        let stats = runtime.server().stats();
        if generation == Generation::V2 {
            assert!(stats.doorbell_sleeps > 0, "{stats}");
            assert!(stats.doorbell_rings >= 1, "{stats}");
        } else {
            assert_eq!(stats.doorbell_sleeps, 0, "v1 has no doorbell: {stats}");
        }
        assert_eq!(stats.served_of(Opcode::TEST_INCREMENT), 3);
    }
}

/// A kernel that keeps calling the server until a call fails: it only ends if aborted.
fn endless_image() -> Vec<u8> {
    HostImage::new("endless")
        .kernel("spin", |warp| {
            while warp.call(Opcode::TEST_INCREMENT, |_| 1).is_ok() {}
        })
        .kernel("quick", |warp| {
            warp.call(Opcode::TEST_INCREMENT, |_| 1).unwrap();
        })
        .into_bytes()
}

/// `deinit` with a kernel still running waits its bounded wait, aborts the kernel (the device's
/// reset) and returns an error naming it, instead of hanging; the runtime is then finished:
/// its server cannot start again.
#[test]
fn deinit_with_a_running_kernel_aborts_it_and_names_it() {
    let (mut runtime, _) = runtime(HostConfig {
        devices: 1,
        lanes: 32,
        ports: 8,
    });
    runtime.set_deinit_wait(Duration::from_millis(50));
    let image = runtime.load_image(0, &endless_image()).unwrap();
    runtime
        .launch(image, "spin", &[], Grid::linear(1, 32))
        .unwrap();
    // The kernel is being served (it runs until aborted, so it is still running at deinit).
    let start = std::time::Instant::now();
    while runtime.server().stats().served_of(Opcode::TEST_INCREMENT) == 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "never served");
        std::thread::yield_now();
    }
    match runtime.deinit() {
        Err(Error::Plugin(PluginError::KernelsAborted(names))) => {
            assert!(names.contains("spin on device 0"), "{names}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(runtime.deinit(), Ok(()), "twice is fine");
    assert_eq!(runtime.server().start(), Err(ServerError::Deinitialised));
    assert!(
        runtime.load_image(0, &endless_image()).is_err(),
        "no device"
    );
}

/// One rule for a stopped server: `launch` and `load_image` of an RPC image start it, so a
/// kernel never runs unserved after the embedder's own `shutdown`.
#[test]
fn launch_and_load_image_after_a_shutdown_restart_the_server() {
    let (mut runtime, _) = runtime(HostConfig {
        devices: 1,
        lanes: 32,
        ports: 8,
    });
    let image = runtime.load_image(0, &endless_image()).unwrap();
    assert_eq!(
        runtime.server().shutdown().unwrap(),
        rpc_core::Stopped::Stopped
    );
    runtime
        .launch(image, "quick", &[], Grid::linear(1, 32))
        .unwrap();
    runtime.synchronize(0).unwrap();
    assert!(runtime.server().is_running());
    assert_eq!(
        runtime.server().stats().served_of(Opcode::TEST_INCREMENT),
        1
    );
    assert_eq!(
        runtime.server().shutdown().unwrap(),
        rpc_core::Stopped::Stopped
    );
    assert_eq!(
        runtime.server().shutdown().unwrap(),
        rpc_core::Stopped::AlreadyStopped
    );
    let _second = runtime.load_image(0, &endless_image()).unwrap();
    assert!(runtime.server().is_running());
    assert_eq!(
        runtime.server().start().unwrap(),
        rpc_core::Started::AlreadyRunning
    );
    runtime.deinit().unwrap();
}

#[test]
fn describe_says_what_the_plugin_found_as_every_plugin_does() {
    let two = HostConfig {
        devices: 2,
        lanes: 32,
        ports: 64,
    };
    let line = "host: 2 devices (cpu0: L=32, ports v1=64 v2=64; cpu1: L=32, ports v1=64 v2=64)";
    assert_eq!(rpc_core::plugin::probe(HostPlugin::new(two)), line);
    let mut plugin = HostPlugin::new(two);
    plugin.init().unwrap();
    plugin_contract::devices_are_described(&plugin, "host", &[32, 32], line);
    plugin_contract::deinit_leaves_nothing(&mut plugin, Vec::new);
    let none = HostConfig { devices: 0, ..two };
    assert_eq!(
        rpc_core::plugin::probe(HostPlugin::new(none)),
        "host: 0 devices (configured with 0 devices)"
    );
    let mut plugin = HostPlugin::new(none);
    plugin_contract::zero_devices_with_a_reason(&mut plugin, "configured with 0 devices");
    plugin.deinit().unwrap();
}

/// The launch contract every plugin keeps, here on CPU warps: each `done` runs once by
/// `synchronize`, and one that panics takes nothing down.
#[test]
fn completions_run_once_and_a_panicking_one_is_contained() {
    let mut plugin = HostPlugin::new(HostConfig::default());
    plugin.init().unwrap();
    let device = &plugin.devices()[0];
    let bytes = HostImage::new("main")
        .without_rpc()
        .kernel("main", |_| ())
        .into_bytes();
    let image = device.load_image(&bytes).unwrap();
    plugin_contract::done_runs_once_by_synchronize(device, &image, 32);
    plugin_contract::a_panicking_completion_is_contained(device, &image, 32);
    drop(image);
    plugin.deinit().unwrap();
}

#[test]
fn a_vendor_error_is_the_runtime_errors_source_whole() {
    let (runtime, _) = runtime(HostConfig {
        devices: 1,
        lanes: 1,
        ports: 4,
    });
    let error = runtime.load_image(0, b"no such image").unwrap_err();
    assert!(
        matches!(
            error,
            Error::Plugin(PluginError::Vendor { plugin: "host", .. })
        ),
        "{error:?}"
    );
    // The chain: the runtime's error (reading as the plugin layer's), then the plugin's own
    // error value (not its text), reached through `source()` alone.
    let source = std::error::Error::source(&error).expect("a source");
    assert_eq!(format!("host: load image: {source}"), error.to_string());
    let vendor = source
        .downcast_ref::<rpc_core::plugin::VendorSource>()
        .expect("the vendor's error, whole");
    assert!(
        matches!(
            vendor.get().downcast_ref::<plugin_host::HostError>(),
            Some(plugin_host::HostError::UnknownImage(_))
        ),
        "{vendor:?}"
    );
    let Error::Plugin(PluginError::Vendor { source, .. }) = &error else {
        unreachable!()
    };
    assert_eq!(source, vendor);
}

/// `synchronize` returns only once the server has counted the kernel's requests: 200 short
/// kernels, each one call of a packet opcode and one of a script opcode that goes on after its
/// reply, each followed at once by exact counts. (The worker counts a request after its last
/// hand-over, which lets the kernel end; `synchronize` looked only at the mailbox's flags, so a
/// count read right after it could miss the last request: the crate's own quick-start example
/// asserts such a count. With the script's 1 ms after its reply, it missed it at once.)
#[test]
fn synchronize_returns_once_the_last_requests_are_counted() {
    const PLUS: Opcode = Opcode::user(1);
    const ECHO: Opcode = Opcode::user(2);
    let (mut runtime, _) = runtime(HostConfig::default());
    runtime
        .server()
        .register_packet(PLUS, |_, p| p.set_word(0, p.word(0) + 1000));
    // Its script goes on after its reply, as a handler may (to log, or tidy up): it is
    // counted some time after the kernel could go on. (It sleeps on the server thread to
    // widen that time, which only a test may do; the assertions do not depend on it.)
    runtime.server().register(ECHO, |mut req| async move {
        req.recv_and_send(|_, p| p.set_word(0, p.word(0) + 1))
            .await?;
        std::thread::sleep(Duration::from_millis(1));
        Ok(())
    });
    let image = HostImage::new("counted")
        .kernel("main", |warp| {
            assert_eq!(warp.call(PLUS, |_| 1).unwrap()[0], 1001);
            assert_eq!(warp.call(ECHO, |_| 1).unwrap()[0], 2);
        })
        .into_bytes();
    let image = runtime.load_image(0, &image).unwrap();
    for round in 1..=200 {
        runtime
            .launch(image, "main", &[], Grid::linear(1, 1))
            .unwrap();
        assert_eq!(runtime.synchronize(0).unwrap(), None);
        let stats = runtime.server().stats();
        assert_eq!(stats.served_of(PLUS), round, "round {round}");
        assert_eq!(stats.served_of(ECHO), round, "round {round}");
    }
    runtime.deinit().unwrap();
}

#[test]
fn kernels_call_a_typed_rust_function_on_32_and_64_lanes() {
    for lanes in [32, 64] {
        for generation in [Generation::V1, Generation::V2] {
            let (runtime, _) = runtime(HostConfig {
                devices: 1,
                lanes,
                ports: 8,
            });
            // `uint32_t scale(const char *name, uint32_t *out, uint32_t factor)`: fills `out`
            // (a span) with the name's length times i times the factor.
            const SCALE: Opcode = Opcode::user(60);
            runtime
                .server()
                .register_typed(
                    SCALE,
                    |name: &std::ffi::CStr, out: &mut [u32], factor: u32| {
                        let len = name.to_bytes().len() as u32;
                        for (i, x) in out.iter_mut().enumerate() {
                            *x = len * i as u32 * factor;
                        }
                        out.len() as u32
                    },
                )
                .unwrap();
            let bytes = HostImage::new("typed")
                .generation(generation)
                .kernel("k", |warp| {
                    let mut names: Vec<Vec<u8>> = (0..64)
                        .map(|lane| format!("lane {lane}\0").into_bytes())
                        .collect();
                    let mut outs: Vec<Vec<u8>> =
                        (0..64).map(|lane| vec![0; 4 * (lane % 7 + 1)]).collect();
                    let got = {
                        let mut args: Vec<Vec<CallArg<'_>>> = names
                            .iter_mut()
                            .zip(&mut outs)
                            .map(|(name, out)| {
                                vec![
                                    CallArg::Pointer(Some(&mut name[..])),
                                    CallArg::Pointer(Some(&mut out[..])),
                                    CallArg::value(3u32),
                                ]
                            })
                            .collect();
                        warp.dispatch(SCALE, &mut args, 4).unwrap()
                    };
                    for lane in warp.lanes() {
                        let l = lane as usize;
                        assert_eq!(got[l], ((l % 7 + 1) as u32).to_le_bytes(), "lane {lane}");
                        let len = format!("lane {lane}").len() as u32;
                        let want: Vec<u8> = (0..(l % 7 + 1) as u32)
                            .flat_map(|i| (len * i * 3).to_le_bytes())
                            .collect();
                        assert_eq!(outs[l], want, "lane {lane}");
                    }
                })
                .into_bytes();
            run_k_on_partial_warps(&runtime, &bytes);
            let stats = runtime.server().stats();
            let warps = 2 * 100u64.div_ceil(u64::from(lanes));
            assert_eq!(
                stats.served_of(SCALE),
                warps,
                "{generation} L={lanes}: {stats}"
            );
            assert_eq!(
                (stats.refused, stats.errors, stats.panics),
                (0, 0, 0),
                "{stats}"
            );
        }
    }
}

/// `deinit` while the device's stdout is a pipe nobody reads and a kernel waits for its write
/// to go out: bounded all the same (the kernel's deinit wait, then the server's `io_grace`
/// for the output), the unwritten bytes counted as lost, where a blocking write once held the
/// server thread, and so deinit, until someone read the pipe.
#[test]
fn deinit_is_bounded_while_stdout_is_a_pipe_nobody_reads() {
    const BYTES: usize = 256 << 10;
    let (mut runtime, _) = runtime(HostConfig {
        devices: 1,
        lanes: 32,
        ports: 8,
    });
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: pipe(2) just made both; each is owned once, here.
    let (reader, writer) = unsafe {
        use std::os::fd::FromRawFd;
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    };
    let services = runtime.server().context().services();
    services.set_stdout_fd(writer);
    runtime.set_deinit_wait(Duration::from_millis(50));
    let image = HostImage::new("flood")
        .kernel("flood", |warp| {
            let _ = warp.write(Target::Stdout, |_| vec![b'x'; BYTES]);
        })
        .into_bytes();
    let image = runtime.load_image(0, &image).unwrap();
    runtime
        .launch(image, "flood", &[], Grid::linear(1, 1))
        .unwrap();
    // The write is in once the pipe holds bytes (it is committed whole): what the pipe did not
    // take waits in the stream's queue.
    use std::os::fd::AsRawFd;
    let in_pipe = || {
        let mut bytes: libc::c_int = 0;
        // SAFETY: FIONREAD writes one c_int through the pointer.
        let status = unsafe { libc::ioctl(reader.as_raw_fd(), libc::FIONREAD, &mut bytes) };
        assert_eq!(status, 0);
        bytes as u64
    };
    let start = std::time::Instant::now();
    while in_pipe() == 0 {
        assert!(start.elapsed() < Duration::from_secs(60), "never written");
        std::thread::sleep(Duration::from_millis(1));
    }
    // On a thread of its own, so that a deinit that hangs fails the test at the hang guard
    // instead of holding the suite.
    let (done, ended) = std::sync::mpsc::channel();
    let deinit = std::thread::spawn(move || {
        let result = runtime.deinit();
        let _ = done.send(());
        (runtime, result)
    });
    ended
        .recv_timeout(Duration::from_secs(60))
        .expect("hang guard: deinit with a stalled stdout");
    let (runtime, result) = deinit.join().unwrap();
    match result {
        Err(Error::Plugin(PluginError::KernelsAborted(names))) => {
            assert!(names.contains("flood on device 0"), "{names}")
        }
        other => panic!("{other:?}"),
    }
    let lost = runtime.server().stats().output_lost_bytes;
    assert_eq!(lost + in_pipe(), BYTES as u64, "lost and written");
    assert!(lost > 0);
    drop(reader);
}
