//! The plugins as loaded libraries: the host plugin twice in one process (linked in, and from
//! `libplugin_host.so` through the loader), a C program driving `libplugin_host.so` through
//! the header, the loader's clear errors, and the GPU plugins' libraries with no driver.
//!
//! The libraries are built by the first test that needs them, with `cargo build` into a
//! target folder of their own (`target/plugin-libs`): the `cargo test` running this holds the
//! lock of the normal one, and cargo's lock on the other serialises test binaries that build
//! at once. The C programs are built with `cc` into a temporary folder.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use plugin_host::{HostConfig, HostImage, HostPlugin};
use plugin_loader::{find_plugins, plugin_name_of, LoadError, LoadedPlugin};
use rpc_core::plugin::Grid;
use rpc_core::{
    ExitPolicy, Opcode, PacketHandler, PluginRuntime, Runtime, ServerConfig, ServicesConfig,
    Started, Stopped,
};

const OPCODE: Opcode = Opcode::user(7);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .into()
}

/// The folder holding `libplugin_{host,cuda,amdgpu}.so`, built once.
fn libraries() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let target = root().join("target/plugin-libs");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        // Two builds: a target flag (`--example`) would narrow every package given with it to
        // that target, leaving the libraries out.
        let builds: [&[&str]; 2] = [
            &[
                "-p",
                "plugin-host-so",
                "-p",
                "plugin-cuda-so",
                "-p",
                "plugin-amdgpu-so",
            ],
            // The native host image written in Rust (`examples/native_kernel.rs`).
            &["-p", "examples", "--example", "native_kernel"],
        ];
        for packages in builds {
            let status = Command::new(&cargo)
                .current_dir(root())
                .args(["build", "--quiet"])
                .args(packages)
                .arg("--target-dir")
                .arg(&target)
                .status()
                .expect("cargo runs");
            assert!(status.success(), "building {packages:?}: {status}");
        }
        target.join("debug")
    })
}

/// A folder for this test's C builds.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("plugin-loader-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `cc` of `source` (in tests/c, or the host plugin's kernel image `plugin-host/tests/c/kernel.c`)
/// into `out`, with the checked-in header.
fn cc(source: &str, out: &Path, shared: bool) {
    let mut command = Command::new("cc");
    command
        .arg("-std=c11")
        .args(["-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(match source {
            "kernel.c" => root().join("plugin-host/tests/c/kernel.c"),
            _ => root().join("plugin-loader/tests/c").join(source),
        })
        .arg("-o")
        .arg(out);
    if shared {
        command.args(["-shared", "-fPIC"]);
    } else {
        command.arg("-ldl");
    }
    let status = command.status().expect("cc runs");
    assert!(status.success(), "cc {source}: {status}");
}

/// The native kernel image (plugin-host/tests/c/kernel.c), built once.
fn kernel_image() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let out = scratch("kernel").join("kernel.so");
        cc("kernel.c", &out, true);
        std::fs::read(&out).unwrap()
    })
}

/// The arguments of `kernel.c`'s `ask`: opcode, value, where each lane's reply goes.
fn ask_args(opcode: Opcode, value: u64, out: &mut [u64]) -> Vec<u8> {
    let mut args = opcode.0.to_le_bytes().to_vec();
    args.extend([0; 4]);
    args.extend(value.to_le_bytes());
    args.extend((out.as_mut_ptr() as u64).to_le_bytes());
    args
}

fn handler(reply: impl Fn(u64) -> u64 + Send + Sync + 'static) -> PacketHandler {
    Arc::new(move |request| {
        for lane in rpc_core::protocol::lanes(request.mask) {
            let word = &mut request.buffers[lane as usize][0];
            *word = reply(*word);
        }
    })
}

fn open(name: &str) -> LoadedPlugin {
    let path = libraries().join(format!("libplugin_{name}.so"));
    LoadedPlugin::open(&path, plugin_abi::RPC_INIT_RECORD_EXIT).unwrap()
}

/// The seed's case: two instances of the host plugin in one process, one linked in and one
/// loaded, each with its own server thread and its own handler of the same opcode; shutting
/// one down leaves the other serving.
#[test]
fn the_host_plugin_linked_in_and_loaded_serves_twice_independently() {
    let config = ServerConfig {
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            ..Default::default()
        },
        ..Default::default()
    };
    let linked = PluginRuntime::new(HostPlugin::new(HostConfig::default()), config).unwrap();
    let loaded = open("host");
    let runtimes: [&dyn Runtime; 2] = [&linked, &loaded];
    for runtime in runtimes {
        assert_eq!(runtime.plugin_name(), "host");
        assert_eq!(runtime.device_name(0).as_deref(), Some("cpu0"));
    }
    linked.register_packet_handler(OPCODE, handler(|x| x + 1));
    loaded.register_packet_handler(OPCODE, handler(|x| x * 10));
    let linked_image = Runtime::load_image(
        &linked,
        0,
        &HostImage::new("ask")
            .kernel("ask", |warp| {
                let replies = warp.call(OPCODE, |lane| 1000 + u64::from(lane)).unwrap();
                let out = warp.args().as_ptr() as *const u64;
                // SAFETY: the test passes a pointer to 64 u64 in `args`; one warp writes them.
                let out = unsafe { out.read_unaligned() } as *mut u64;
                for lane in warp.lanes() {
                    // SAFETY: as above; lane < 64.
                    unsafe { *out.add(lane as usize) = replies[lane as usize] };
                }
            })
            .into_bytes(),
    )
    .unwrap();
    let loaded_image = loaded.load_image(0, kernel_image()).unwrap();
    assert!(loaded.mailbox(loaded_image).is_some());

    let run_linked = || {
        let mut out = vec![0u64; 64];
        let args = (out.as_mut_ptr() as u64).to_le_bytes();
        Runtime::launch(&linked, linked_image, "ask", &args, Grid::linear(1, 32)).unwrap();
        assert_eq!(Runtime::synchronize(&linked, 0).unwrap(), None);
        out.truncate(32);
        out
    };
    let run_loaded = || {
        let mut out = vec![0u64; 32];
        let args = ask_args(OPCODE, 5, &mut out);
        loaded
            .launch(loaded_image, "ask", &args, Grid::linear(1, 32))
            .unwrap();
        assert_eq!(loaded.synchronize(0).unwrap(), None);
        out
    };
    let plus_one: Vec<u64> = (0..32).map(|lane| 1001 + lane).collect();
    let times_ten: Vec<u64> = (0..32).map(|lane| 10 * (5 + lane)).collect();
    assert_eq!(run_linked(), plus_one);
    assert_eq!(run_loaded(), times_ten);
    assert_eq!(linked.stats().served_of(OPCODE), 1);
    assert_eq!(loaded.stats().served_of(OPCODE), 1);

    // Shut the linked one down: the loaded one still serves, and the linked one stays down.
    assert_eq!(linked.shutdown_server().unwrap(), Stopped::Stopped);
    assert_eq!(linked.shutdown_server().unwrap(), Stopped::AlreadyStopped);
    assert_eq!(run_loaded(), times_ten);
    assert!(!linked.server().is_running());
    assert_eq!(linked.stats().served_of(OPCODE), 1);
    assert_eq!(loaded.stats().served_of(OPCODE), 2);
    // And the other way round.
    assert_eq!(loaded.shutdown_server().unwrap(), Stopped::Stopped);
    assert_eq!(loaded.shutdown_server().unwrap(), Stopped::AlreadyStopped);
    assert_eq!(run_linked(), plus_one);
    assert_eq!(loaded.start_server().unwrap(), Started::Started);
    assert_eq!(loaded.start_server().unwrap(), Started::AlreadyRunning);
    assert_eq!(loaded.stats().served_of(OPCODE), 2);

    let mut runtimes: Vec<Box<dyn Runtime>> = vec![Box::new(linked), Box::new(loaded)];
    for runtime in &mut runtimes {
        plugin_contract::deinit_is_final(&mut **runtime);
    }
}

/// A loaded `libplugin_host.so` carries its own copy of plugin-host, whose image registry
/// is not the program's: it runs native shared objects (above), and refuses, saying so, the
/// bytes of a `HostImage` the program registered, which the linked-in plugin runs.
#[test]
fn a_loaded_host_plugin_runs_native_images_not_the_programs_host_images() {
    let image = HostImage::new("rust kernels")
        .without_rpc()
        .kernel("nothing", |_| {})
        .into_bytes();
    let loaded = open("host");
    let error = loaded.load_image(0, &image).unwrap_err().to_string();
    assert!(
        error.contains("a loaded libplugin_host.so runs native shared objects")
            && error.contains("rust kernels"),
        "{error}"
    );
    let linked = PluginRuntime::new(
        HostPlugin::new(HostConfig::default()),
        ServerConfig::default(),
    )
    .unwrap();
    let id = Runtime::load_image(&linked, 0, &image).unwrap();
    Runtime::launch(&linked, id, "nothing", &[], Grid::linear(1, 32)).unwrap();
    assert_eq!(Runtime::synchronize(&linked, 0).unwrap(), None);
}

/// A native host image written in Rust, a `cdylib` exporting its client object and a kernel
/// (`examples/native_kernel.rs`), runs on the loaded library: the Rust way to give a loaded
/// `libplugin_host.so` kernels.
#[test]
fn a_rust_native_image_runs_on_the_loaded_host_plugin() {
    let image = std::fs::read(libraries().join("examples/libnative_kernel.so")).unwrap();
    let loaded = open("host");
    let id = loaded.load_image(0, &image).unwrap();
    assert!(
        loaded.mailbox(id).is_some(),
        "its client object attaches a mailbox"
    );
    let mut out = vec![0u64; 64];
    let mut args = 40u64.to_le_bytes().to_vec();
    args.extend((out.as_mut_ptr() as u64).to_le_bytes());
    loaded
        .launch(id, "increment", &args, Grid::linear(2, 32))
        .unwrap();
    assert_eq!(loaded.synchronize(0).unwrap(), None);
    let expected: Vec<u64> = (0..64).map(|thread| 41 + thread).collect();
    assert_eq!(out, expected);
    assert_eq!(loaded.stats().served_of(Opcode::TEST_INCREMENT), 2);
}

/// A C program loads `libplugin_host.so` through the header, registers a handler, runs a
/// native kernel, writes to a stdout that takes nothing (`/dev/full`) and reads the bytes
/// lost in the statistics, stops the server (twice) and deinitialises (tests/c/host.c).
#[test]
fn a_c_program_drives_the_host_plugins_library() {
    let dir = scratch("c-host");
    let host = dir.join("host");
    cc("host.c", &host, false);
    let kernel = dir.join("kernel.so");
    std::fs::write(&kernel, kernel_image()).unwrap();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let output = Command::new(&host)
        .arg(libraries().join("libplugin_host.so"))
        .arg(&kernel)
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}: {stderr}", output.status);
    assert_eq!(stderr, "ok\n");
}

/// Builds `library` from `source` and opens it, which must fail: how.
fn refused(library: &Path, source: &str) -> LoadError {
    cc(source, library, true);
    LoadedPlugin::open(library, 0).err().unwrap()
}

/// A library of another ABI version and one with no entry symbol are refused, saying why.
#[test]
fn a_wrong_version_or_a_missing_entry_is_a_clear_error() {
    let dir = scratch("bad");
    let error = refused(&dir.join("libplugin_bad.so"), "bad_version.c");
    assert!(matches!(
        error,
        LoadError::Version {
            found: 999,
            expected: 2,
            ..
        }
    ));
    assert!(
        error
            .to_string()
            .ends_with("plugin ABI version 999, but this loader speaks version 2"),
        "{error}"
    );
    let error = refused(&dir.join("libplugin_none.so"), "no_entry.c");
    assert!(matches!(error, LoadError::NoEntry(..)));
    assert!(
        error
            .to_string()
            .contains("not a plugin: no entry symbol `rpc_plugin_entry`"),
        "{error}"
    );
    let missing = dir.join("libplugin_missing.so");
    let error = LoadedPlugin::open(&missing, 0).err().unwrap();
    assert!(matches!(error, LoadError::Open(..)), "{error}");
}

/// A failure inside the loaded plugin names the plugin and the call once, as the linked-in
/// plugin's does (the library used to send `host: load image: ...`, which the loader
/// prefixed again).
#[test]
fn a_loaded_plugins_error_names_the_plugin_and_the_call_once() {
    let loaded = open("host");
    let error = loaded.load_image(0, b"not a shared object").unwrap_err();
    let text = error.to_string();
    assert!(text.starts_with("host: load image: "), "{text}");
    assert_eq!(text.matches("load image").count(), 1, "{text}");
    let linked =
        PluginRuntime::new(HostPlugin::new(Default::default()), ServerConfig::default()).unwrap();
    let direct = Runtime::load_image(&linked, 0, b"not a shared object").unwrap_err();
    assert_eq!(text, direct.to_string());
}

/// With no GPU driver here, the GPU plugins' libraries load and report no device, with why.
#[test]
fn the_gpu_plugins_libraries_load_with_zero_devices_and_the_reason() {
    for name in ["cuda", "amdgpu"] {
        let plugin = open(name);
        assert_eq!(plugin.plugin_name(), name);
        if plugin.device_count() > 0 {
            eprintln!("{name}: a device is present; nothing to check here");
            continue;
        }
        let reason = plugin.reason().unwrap();
        assert!(!reason.is_empty(), "{name}");
        assert_eq!(plugin.device_name(0), None);
        let error = plugin.load_image(0, b"image").unwrap_err();
        assert!(
            matches!(
                error,
                rpc_core::Error::Plugin(rpc_core::PluginError::NotFound(_))
            ),
            "{error}"
        );
    }
}

/// `find_plugins` finds `libplugin_NAME.so` in the folders of RPC_PLUGIN_PATH, then the given
/// one, each name once.
#[test]
fn plugins_are_found_by_name_in_the_given_folder() {
    let found = find_plugins(Some(libraries()));
    let names: Vec<&str> = found.iter().filter_map(|p| plugin_name_of(p)).collect();
    for name in ["amdgpu", "cuda", "host"] {
        assert_eq!(names.iter().filter(|n| **n == name).count(), 1, "{found:?}");
    }
    assert_eq!(
        plugin_name_of(Path::new("/x/libplugin_host.so")),
        Some("host")
    );
    assert_eq!(plugin_name_of(Path::new("/x/libplugin_.so")), None);
    assert_eq!(plugin_name_of(Path::new("/x/libother.so")), None);
}

/// What a loader such as rpc-run needs of a loaded plugin: an image's globals, memory the
/// device sees, copies both ways.
#[test]
fn a_loaded_plugin_finds_globals_allocates_and_copies() {
    let plugin = open("host");
    let image = plugin.load_image(0, kernel_image()).unwrap();
    let client = plugin.find_symbol(image, "__llvm_rpc_client").unwrap();
    assert_eq!(client.size, 2096);
    assert_eq!(client.addr % 64, 0);
    assert_eq!(plugin.find_symbol(image, "no_such_global"), None);
    let region = plugin.alloc_shared(0, 100).unwrap();
    assert_eq!(region.len(), 100);
    assert_eq!(region.host_ptr() as usize % 64, 0);
    let bytes: Vec<u8> = (0..100).collect();
    plugin
        .copy_to_device(0, region.device_addr() + 3, &bytes[..90])
        .unwrap();
    let mut back = vec![0u8; 90];
    plugin
        .copy_from_device(0, region.device_addr() + 3, &mut back)
        .unwrap();
    assert_eq!(back, bytes[..90]);
    let error = plugin
        .copy_to_device(0, region.device_addr() + 99, &bytes)
        .unwrap_err();
    assert!(error.to_string().contains("copy to device"), "{error}");
    drop(region);
}
