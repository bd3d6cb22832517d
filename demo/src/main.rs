//! `rpc-demo`: a small offload program whose kernels print, write and read a file, allocate,
//! call a custom opcode and make one refused request, all served by the plugin's own RPC server.
//!
//! `rpc-demo [--plugin host|cuda|amdgpu] [--image FILE --kernel NAME] [--json]`: the host plugin
//! (CPU warps) runs the built-in program; a GPU plugin lists its devices and runs a device image
//! given with `--image`, or says clearly why it cannot (no driver, no device, no image). The
//! server's statistics end the output: a line of text, or with `--json` one line of JSON
//! (`StatsSnapshot::to_json`).

use std::process::ExitCode;

use rpc_core::plugin::{Grid, Plugin};
use rpc_core::PluginRuntime;
use rpc_core::{ExitPolicy, ServerConfig, ServicesConfig};

#[cfg(feature = "host")]
mod host;

/// The command line.
#[derive(clap::Parser)]
#[command(
    name = "rpc-demo",
    about = "A small offload program served by the plugin's own RPC server: the host plugin's \
             warps print, write and read a file, allocate, call a custom opcode and make \
             refused requests; a GPU plugin lists its devices and runs a device image"
)]
struct Args {
    /// The plugin: host (CPU warps run the built-in program), or cuda or amdgpu (run
    /// --image on the first GPU)
    #[arg(long, value_name = "PLUGIN", value_enum, default_value_t = PluginName::Host)]
    plugin: PluginName,
    /// A device image to run on the cuda or amdgpu plugin
    #[arg(long, value_name = "FILE")]
    image: Option<String>,
    /// The kernel of --image to run
    #[arg(long, value_name = "NAME", default_value = "main", requires = "image")]
    kernel: String,
    /// The server's statistics as one line of JSON, last
    #[arg(long)]
    json: bool,
}

/// The plugins a demo can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum PluginName {
    Host,
    Cuda,
    Amdgpu,
}

/// Parses the command line; `--help` (exit 0) or a usage error (exit 2, the message and the
/// usage) ends the process.
fn parse_args() -> Args {
    use clap::{CommandFactory, Parser};
    let parsed = Args::try_parse().and_then(|args| {
        if args.plugin == PluginName::Host && args.image.is_some() {
            return Err(Args::command().error(
                clap::error::ErrorKind::ArgumentConflict,
                "--image and --kernel are for the cuda and amdgpu plugins (the host demo runs \
                 its own kernels)",
            ));
        }
        Ok(args)
    });
    match parsed {
        Ok(args) => args,
        Err(help) if !help.use_stderr() => help.exit(),
        Err(error) => {
            let text = error.render().to_string();
            eprint!("{text}");
            if !text.contains("Usage:") {
                eprintln!("\n{}", Args::command().render_usage());
            }
            std::process::exit(2)
        }
    }
}

/// The server settings of the demo: EXIT is reported to the launcher, not the end of us.
fn server_config() -> ServerConfig {
    ServerConfig {
        services: ServicesConfig {
            exit: ExitPolicy::Record,
            ..ServicesConfig::default()
        },
        ..ServerConfig::default()
    }
}

/// Runs a device image on a GPU plugin's first device, or explains why not.
#[allow(dead_code)] // Unused when built with the host plugin only.
fn run_gpu<P: Plugin>(plugin: P, args: &Args) -> Result<(), String> {
    let name = plugin.name();
    let mut runtime = PluginRuntime::new(plugin, server_config()).map_err(|e| e.to_string())?;
    let found = rpc_core::plugin::describe(runtime.plugin());
    if runtime.devices().is_empty() {
        return Err(format!("no {name} device: {found}"));
    }
    println!("{found}");
    let Some(path) = &args.image else {
        return Err(format!("the {name} demo runs a device image built for this GPU: pass --image FILE --kernel NAME"));
    };
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let image = runtime.load_image(0, &bytes).map_err(|e| e.to_string())?;
    runtime
        .launch(image, &args.kernel, &[], Grid::linear(1, 64))
        .map_err(|e| e.to_string())?;
    let result = runtime.synchronize(0);
    print_stats(&runtime.server().stats(), args.json);
    runtime.deinit().map_err(|e| e.to_string())?;
    match result.map_err(|e| e.to_string())? {
        None => Ok(()),
        Some(exit) => Err(format!("the kernel ended the program: {exit:?}")),
    }
}

/// The statistics line: text, or with `--json` the JSON object alone.
fn print_stats(stats: &rpc_core::StatsSnapshot, json: bool) {
    if json {
        println!("{}", stats.to_json());
    } else {
        println!("-- server statistics: {stats}");
    }
}

fn run(args: &Args) -> Result<(), String> {
    match args.plugin {
        #[cfg(feature = "host")]
        PluginName::Host => host::run(args.json),
        #[cfg(feature = "cuda")]
        PluginName::Cuda => run_gpu(plugin_cuda::CudaPlugin::new(), args),
        #[cfg(feature = "amdgpu")]
        PluginName::Amdgpu => run_gpu(plugin_amdgpu::AmdGpuPlugin::new(), args),
        // Reachable when a plugin feature is off.
        #[allow(unreachable_patterns)]
        other => Err(format!(
            "this rpc-demo was built without the {} plugin",
            format!("{other:?}").to_lowercase()
        )),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = parse_args();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("rpc-demo: {message}");
            ExitCode::FAILURE
        }
    }
}
