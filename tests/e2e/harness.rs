//! The test control plane harness itself (`support::Cluster`): what a test
//! binary leaves behind when it exits.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

/// Set in the child test binary this test runs.
const CHILD: &str = "TUNA_TEST_HARNESS_CHILD";

/// The pids of processes whose command line names a path under `dir`.
fn processes_under(dir: &Path) -> Vec<u32> {
    let needle = dir.to_str().unwrap().as_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle))
        })
        .collect()
}

/// A test binary that exits while its spare control plane is still
/// starting leaves no process behind: the watchdog stops the spare once its
/// start ends. Before the fix, the watchdog shell died of SIGPIPE writing the
/// start's status to the binary that was gone, and every run of a few
/// filtered tests left an etcd, kube-apiserver and kube-controller-manager
/// running for good.
#[test]
fn a_test_binary_that_exits_while_its_spare_starts_leaves_no_control_plane() {
    if std::env::var_os(CHILD).is_some() {
        // Taking a cluster starts the spare; exit before it is up.
        let runtime = tokio::runtime::Runtime::new().unwrap();
        drop(runtime.block_on(support::Cluster::start()));
        std::process::exit(0);
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "harness::a_test_binary_that_exits_while_its_spare_starts_leaves_no_control_plane",
        ])
        .env(CHILD, "1")
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The spare's start takes seconds, and its stop a moment after that.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut left = processes_under(tmp.path());
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        left = processes_under(tmp.path());
    }
    if !left.is_empty() {
        let described: Vec<String> = left
            .iter()
            .map(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                format!(
                    "{pid}: {}",
                    String::from_utf8_lossy(&cmdline).replace('\0', " ")
                )
            })
            .collect();
        // Leave nothing behind ourselves either.
        for dir in std::fs::read_dir(tmp.path()).unwrap().flatten() {
            let cluster = dir.path().join("cluster");
            let _ = std::process::Command::new(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-cluster.sh"),
            )
            .arg("stop")
            .arg("--dir")
            .arg(&cluster)
            .status();
        }
        panic!(
            "processes of the child's control planes still run 90 s after it exited:\n{}",
            described.join("\n")
        );
    }
}
