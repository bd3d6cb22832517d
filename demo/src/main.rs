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

const USAGE: &str = "\
usage: rpc-demo [--plugin host|cuda|amdgpu] [--image FILE [--kernel NAME]] [--json]
  --plugin host     the host plugin's own kernels (the default)
  --plugin cuda|amdgpu --image FILE [--kernel NAME]
                    run kernel NAME (default `main`) of a device image on the first GPU
  --json            the server's statistics as one line of JSON, last
  --help            this text";

struct Args {
    plugin: String,
    image: Option<String>,
    kernel: String,
    /// Print the statistics as JSON.
    json: bool,
}

/// Why the command line is not run: a usage error (exit 2) or `--help` (exit 0).
enum NotRun {
    Usage(String),
    Help,
}

fn parse_args() -> Result<Args, NotRun> {
    use lexopt::Arg::{Long, Short};
    let usage = |why: String| NotRun::Usage(why);
    let mut args = Args {
        plugin: "host".into(),
        image: None,
        kernel: "main".into(),
        json: false,
    };
    let mut kernel_given = false;
    let mut parser = lexopt::Parser::from_env();
    while let Some(arg) = parser.next().map_err(|e| usage(e.to_string()))? {
        let value = |parser: &mut lexopt::Parser| -> Result<String, NotRun> {
            let value = parser.value().map_err(|e| usage(e.to_string()))?;
            Ok(value.to_string_lossy().into_owned())
        };
        match arg {
            Long("help") | Short('h') => return Err(NotRun::Help),
            Long("plugin") => args.plugin = value(&mut parser)?,
            Long("image") => args.image = Some(value(&mut parser)?),
            Long("json") => args.json = true,
            Long("kernel") => {
                args.kernel = value(&mut parser)?;
                kernel_given = true;
            }
            other => return Err(usage(other.unexpected().to_string())),
        }
    }
    if args.plugin == "host" && (args.image.is_some() || kernel_given) {
        return Err(usage(
            "--image and --kernel are for the cuda and amdgpu plugins (the host demo runs its \
             own kernels)"
                .into(),
        ));
    }
    Ok(args)
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
    match args.plugin.as_str() {
        #[cfg(feature = "host")]
        "host" => host::run(args.json),
        #[cfg(feature = "cuda")]
        "cuda" => run_gpu(plugin_cuda::CudaPlugin::new(), args),
        #[cfg(feature = "amdgpu")]
        "amdgpu" => run_gpu(plugin_amdgpu::AmdGpuPlugin::new(), args),
        // Reachable when a plugin feature is off.
        #[allow(unreachable_patterns)]
        "host" | "cuda" | "amdgpu" => Err(format!(
            "this rpc-demo was built without the {} plugin",
            args.plugin
        )),
        other => Err(format!("unknown plugin {other:?} (host, cuda or amdgpu)")),
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args = match parse_args() {
        Ok(args) => args,
        Err(NotRun::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(NotRun::Usage(message)) => {
            eprintln!("rpc-demo: {message}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("rpc-demo: {message}");
            ExitCode::FAILURE
        }
    }
}
