//! The kit's run.sh on a machine with no GPU and no CUDA toolkit (this one): it ends cleanly,
//! every step that needs the GPU or nvcc is reported as skipped, what needs neither (reading
//! LLVM's images with `rpc-run --inspect`) passes, and the last line is the summary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn copy_executable(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
}

#[test]
fn run_sh_without_a_gpu_skips_every_gpu_step_and_prints_the_summary() {
    if Path::new("/dev/nvidia0").exists() {
        eprintln!("skipped: this machine has an NVIDIA GPU (run.sh would use it)");
        return;
    }
    let kit = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpu-kit");
    let _ = std::fs::remove_dir_all(&kit);
    std::fs::create_dir_all(kit.join("bin")).unwrap();
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["run.sh", "rpc_client.cu"] {
        copy_executable(&here.join(file), &kit.join(file));
    }
    let check = PathBuf::from(env!("CARGO_BIN_EXE_cuda-gpu-check"));
    copy_executable(&check, &kit.join("bin/cuda-gpu-check"));
    // rpc-run is another package's binary: there when the workspace was built (cargo test
    // --workspace, as `cargo xtask test` runs it). The LLVM images come with it, where
    // `cargo xtask gpu-images` has built them.
    let rpc_run = check.with_file_name("rpc-run");
    let images = here.join("../../target/gpu-images/nvptx64");
    let mut with_images = 0;
    if rpc_run.exists() {
        copy_executable(&rpc_run, &kit.join("bin/rpc-run"));
        std::fs::create_dir_all(kit.join("images")).unwrap();
        for image in std::fs::read_dir(&images).into_iter().flatten().flatten() {
            let path = image.path();
            if path.extension().is_none() {
                copy_executable(&path, &kit.join("images").join(image.file_name()));
                with_images += 1;
            }
        }
    } else {
        eprintln!(
            "no {}: the kit is checked without LLVM images",
            rpc_run.display()
        );
    }
    // A PTX for the check to try (a device is needed before it loads) and rpc-run to read.
    std::fs::write(
        kit.join("rpc_client.clang.ptx"),
        ".version 7.0\n.target sm_70\n.visible .global .align 8 .b8 __llvm_rpc_client[552];\n\
         .visible .entry rpc_test_increment(.param .u64 result)\n{\nret;\n}\n",
    )
    .unwrap();

    // Called by a relative path, from elsewhere.
    let output = Command::new("bash")
        .current_dir(kit.parent().unwrap())
        .args(["gpu-kit/run.sh", "--quick"])
        .env("PATH", "/usr/bin:/bin") // no nvcc, whatever this machine has
        .env("GPU_CHECK_TIMEOUT", "120")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    let results: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("PASS ") || l.starts_with("FAIL ") || l.starts_with("SKIP "))
        .collect();
    let count = |verdict: &str| results.iter().filter(|l| l.starts_with(verdict)).count();
    assert_eq!(
        summary,
        format!(
            "GPU-CHECK SUMMARY pass={} fail=0 skip={}",
            count("PASS"),
            count("SKIP")
        ),
        "{stdout}"
    );
    for needs_gpu_or_nvcc in ["nvcc-cubin", "nvcc-ptx", "gpu-check-cubin", "gpu-check-ptx"] {
        assert!(
            results
                .iter()
                .any(|l| l.starts_with(&format!("SKIP {needs_gpu_or_nvcc}: "))),
            "{needs_gpu_or_nvcc}: {stdout}"
        );
    }
    assert!(
        stdout.contains("SKIP gpu-check-ptx: no CUDA device (cuda: 0 devices ("),
        "{stdout}"
    );
    // Each image: read (no GPU needed), and its run skipped.
    let runs = results.iter().filter(|l| l.contains(" run-")).count();
    assert_eq!(runs, with_images, "{stdout}");
    assert!(results
        .iter()
        .filter(|l| l.contains(" run-"))
        .all(|l| l.starts_with("SKIP ")));
    // One inspection per image, and of the client's PTX where rpc-run is there.
    let inspected = with_images + usize::from(rpc_run.exists());
    assert_eq!(count("PASS"), inspected, "{stdout}");
    assert!(!kit.join("core").exists());
}

/// A step that hangs (an nvcc that never returns) is stopped by the whole run's bound: the
/// run fails, says so, prints the summary, and leaves no process behind.
#[test]
fn a_hung_step_is_stopped_by_the_runs_bound_and_the_summary_still_comes() {
    let kit = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpu-kit-hung");
    let _ = std::fs::remove_dir_all(&kit);
    std::fs::create_dir_all(kit.join("fake-cuda")).unwrap();
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    copy_executable(&here.join("run.sh"), &kit.join("run.sh"));
    let pid_file = kit.join("nvcc.pid");
    let nvcc = kit.join("fake-cuda/nvcc");
    std::fs::write(
        &nvcc,
        format!(
            "#!/bin/sh\necho $$ > '{}'\nexec sleep 600\n",
            pid_file.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();

    let output = Command::new("bash")
        .arg(kit.join("run.sh"))
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", kit.join("fake-cuda").display()),
        )
        .env("GPU_CHECK_TIMEOUT", "3")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL run: the whole run passed its bound of 3 s and was stopped"),
        "{stdout}"
    );
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.starts_with("GPU-CHECK SUMMARY pass=0 fail=1 skip="),
        "{stdout}"
    );
    // The hung nvcc was killed with its step's process group (a zombie at most, until reaped).
    // (No pid file: the run was stopped before nvcc even started, on a very loaded machine.)
    if let Ok(pid) = std::fs::read_to_string(&pid_file) {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
        let state = stat
            .rsplit(") ")
            .next()
            .and_then(|rest| rest.chars().next());
        assert!(
            matches!(state, None | Some('Z')),
            "nvcc still alive: {stat}"
        );
    }
}
