//! The demo program on the host plugin: CPU warps speaking the real protocol.

use std::ffi::CStr;
use std::sync::Arc;

use plugin_host::{Arg, HostConfig, HostImage, HostPlugin, Target};
use rpc_core::plugin::Grid;
use rpc_core::protocol::CallArg;
use rpc_core::services::malloc_alignment;
use rpc_core::PluginRuntime;
use rpc_core::{FilePolicy, Opcode};

/// The demo's own opcode: the server answers `buf[0]` squared.
const SQUARE: Opcode = Opcode::user(1);
/// A typed call (LLVM 23's `rpc::dispatch`): `uint32_t count_up(const char *name, uint32_t
/// *out)` with `out` a span, filled with the name's length plus i; returns the span's length.
const COUNT_UP: Opcode = Opcode::user(2);

pub fn run(json: bool) -> Result<(), String> {
    // One device of 32 lanes, 64 ports.
    let mut runtime = PluginRuntime::new(
        HostPlugin::new(HostConfig::default()),
        super::server_config(),
    )
    .map_err(|e| e.to_string())?;
    println!("{}", rpc_core::plugin::describe(runtime.plugin()));
    let server = runtime.server();
    server.register_packet(SQUARE, move |_, p| {
        p.set_word(0, p.word(0).wrapping_mul(p.word(0)))
    });
    server
        .register_typed(COUNT_UP, |name: &CStr, out: &mut [u32]| -> u32 {
            let len = name.to_bytes().len() as u32;
            for (i, x) in out.iter_mut().enumerate() {
                *x = len + i as u32;
            }
            out.len() as u32
        })
        .map_err(|e| e.to_string())?;
    // Kernels may only touch files in the demo's own directory.
    let dir = std::env::temp_dir().join(format!("rpc-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    server
        .context()
        .services()
        .set_file_policy(FilePolicy::Sandbox(dir.clone()));
    let path = Arc::new(dir.join("greeting.txt").to_string_lossy().into_owned());

    let image = HostImage::new("demo")
        .kernel("hello", |warp| {
            let block = warp.block();
            let squares = warp
                .call(SQUARE, |lane| u64::from(block * 8 + lane))
                .unwrap();
            warp.printf(
                "block %d lane %d: hello from a CPU warp, %2d squared is %3d (custom opcode)\n",
                |lane| {
                    let id = block * 8 + lane;
                    vec![
                        Arg::Int(block.into()),
                        Arg::Int(lane.into()),
                        Arg::Int(id.into()),
                        Arg::UInt(squares[lane as usize]),
                    ]
                },
            )
            .unwrap();
        })
        .kernel("files", move |warp| {
            let path = path.clone();
            let file = warp.fopen(|_| path.to_string(), "w").unwrap()[0];
            warp.fprintf(Target::File(file), "%s, %d!\n", |_| {
                vec![Arg::Str(Some("written by a kernel")), Arg::Int(42)]
            })
            .unwrap();
            warp.fclose(|_| file).unwrap();
            let file = warp.fopen(|_| path.to_string(), "r").unwrap()[0];
            let line = warp
                .fgets(|_| file, 128)
                .unwrap()
                .remove(0)
                .unwrap_or_default();
            warp.fclose(|_| file).unwrap();
            let line = String::from_utf8_lossy(&line).into_owned();
            warp.printf("file: read back %s", |_| vec![Arg::Str(Some(&line))])
                .unwrap();
        })
        .kernel("memory", |warp| {
            let addrs = warp.malloc(|lane| 1024 * (u64::from(lane) + 1)).unwrap();
            warp.printf(
                "memory: lane %d got %#llx (aligned to its size: %s)\n",
                |lane| {
                    let addr = addrs[lane as usize];
                    let align = malloc_alignment(1024 * (u64::from(lane) + 1));
                    vec![
                        Arg::Int(lane.into()),
                        Arg::UInt(addr),
                        Arg::Str(Some(if addr % align == 0 { "yes" } else { "no" })),
                    ]
                },
            )
            .unwrap();
            warp.free(|lane| addrs[lane as usize]).unwrap();
        })
        .kernel("typed", |warp| {
            // A Rust function called by its C signature: a string and a span it fills.
            let mut names: Vec<Vec<u8>> = (0..64)
                .map(|l| format!("lane {l}\0").into_bytes())
                .collect();
            let mut outs: Vec<Vec<u8>> = (0..64).map(|l| vec![0; 4 * (l % 3 + 1)]).collect();
            let counts = {
                let mut args: Vec<Vec<CallArg<'_>>> = names
                    .iter_mut()
                    .zip(&mut outs)
                    .map(|(name, out)| {
                        vec![
                            CallArg::Pointer(Some(&mut name[..])),
                            CallArg::Pointer(Some(&mut out[..])),
                        ]
                    })
                    .collect();
                warp.dispatch(COUNT_UP, &mut args, 4).unwrap()
            };
            let spans: Vec<String> = outs
                .iter()
                .map(|out| {
                    let values: Vec<String> = out
                        .chunks(4)
                        .map(|b| u32::from_le_bytes(b.try_into().unwrap()).to_string())
                        .collect();
                    values.join(",")
                })
                .collect();
            warp.printf(
                "typed: lane %d: count_up(\"lane %d\") = %u, span %s\n",
                |lane| {
                    let l = lane as usize;
                    let count = u32::from_le_bytes(counts[l][..].try_into().unwrap());
                    vec![
                        Arg::Int(lane.into()),
                        Arg::Int(lane.into()),
                        Arg::UInt(count.into()),
                        Arg::Str(Some(&spans[l])),
                    ]
                },
            )
            .unwrap();
        })
        .kernel("refused", |warp| {
            // A pointer the server never handed out: refused, logged, and the server goes on.
            warp.free(|_| 0xdead_0000).unwrap();
            let outside = warp.fopen(|_| "/etc/passwd".into(), "r").unwrap()[0];
            warp.printf(
                "refused: fopen outside the demo directory returned %llu\n",
                |_| vec![Arg::UInt(outside)],
            )
            .unwrap();
        })
        .into_bytes();

    let image = runtime.load_image(0, &image).map_err(|e| e.to_string())?;
    for (kernel, grid) in [
        ("hello", Grid::linear(2, 8)),
        ("files", Grid::linear(1, 1)),
        ("memory", Grid::linear(1, 4)),
        ("typed", Grid::linear(1, 3)),
        ("refused", Grid::linear(1, 1)),
    ] {
        println!(
            "-- launch {kernel}: {} block(s) x {} thread(s)",
            grid.blocks[0], grid.threads[0]
        );
        runtime
            .launch(image, kernel, &[], grid)
            .map_err(|e| e.to_string())?;
        runtime.synchronize(0).map_err(|e| e.to_string())?;
    }
    let stats = runtime.server().stats();
    let live = runtime
        .server()
        .context()
        .services()
        .live_allocations()
        .len();
    runtime.deinit().map_err(|e| e.to_string())?;
    std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    println!(
        "-- live allocations after the program: {live}; refused requests: {}",
        stats.refused
    );
    crate::print_stats(&stats, json);
    if stats.refused != 2 || live != 0 || stats.panics != 0 {
        return Err("the demo did not behave as expected".into());
    }
    Ok(())
}
