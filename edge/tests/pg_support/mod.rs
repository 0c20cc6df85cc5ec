//! A throw-away PostgreSQL server for the store tests: `initdb` in a
//! temporary directory (as the `postgres` user when the tests run as root,
//! since `initdb` refuses root), a free port on 127.0.0.1, `fsync=off`, and
//! stopped (`pg_ctl -m immediate`) when dropped.
//!
//! The server binaries come from Debian's `postgresql` package
//! (`scripts/setup.sh --k8s MINOR`, run by `scripts/test.sh`, installs it). Without them the tests fail, saying so:
//! CI installs them, so a missing server is a broken setup, not a skip.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// A running server; stopped when dropped.
pub struct PgServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

/// Where `initdb` and `pg_ctl` are: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin`.
fn bindir() -> PathBuf {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let mut candidates: Vec<PathBuf> = from_pg_config.into_iter().collect();
    if let Ok(versions) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut found: Vec<PathBuf> = versions
            .filter_map(|v| v.ok().map(|v| v.path().join("bin")))
            .collect();
        found.sort();
        candidates.extend(found.into_iter().rev());
    }
    candidates
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
        .unwrap_or_else(|| {
            panic!(
                "PostgreSQL's server binaries (initdb, pg_ctl) are not installed: run scripts/setup.sh --k8s 1.37 \
                 (it installs Debian's postgresql package); the PostgreSQL store tests need a real server"
            )
        })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn free_port() -> u16 {
    // Bound and released: PostgreSQL cannot be given port 0. A collision
    // with another test is retried by `start`.
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl PgServer {
    /// Initialises and starts a server (waits until it accepts connections).
    pub fn start() -> Self {
        let bin = bindir();
        let as_postgres = is_root();
        let dir = tempfile::tempdir().unwrap();
        if as_postgres {
            run_ok(Command::new("chown").arg("postgres:").arg(dir.path()));
        }
        let data = dir.path().join("data");
        let server = Self {
            dir,
            bin,
            port: 0,
            as_postgres,
        };
        run_ok(server.command("initdb").args([
            "-D",
            data.to_str().unwrap(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        ]));
        let mut server = server;
        let mut last = None;
        for _ in 0..5 {
            server.port = free_port();
            match server.pg_ctl_start() {
                Ok(()) => return server,
                Err(e) => last = Some(e),
            }
        }
        panic!("PostgreSQL did not start: {}", last.unwrap());
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let output = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("log"))
            // -w waits until the server accepts connections.
            .args(["-w", "-t", "120", "-o", &options, "start"])
            .output()
            .unwrap();
        if output.status.success() {
            Ok(())
        } else {
            let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
            Err(format!("{}\n{log}", describe(&output)))
        }
    }

    /// Stops the server at once (`-m immediate`: no checkpoint, like a crash).
    pub fn kill(&self) {
        run_ok(self.command("pg_ctl").arg("-D").arg(self.data()).args([
            "-m",
            "immediate",
            "-w",
            "stop",
        ]));
    }

    /// Starts the server again on the same port.
    pub fn restart(&self) {
        self.pg_ctl_start()
            .unwrap_or_else(|e| panic!("PostgreSQL did not restart: {e}"));
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// A new empty database; its URL.
    pub fn create_database(&self) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed));
        self.psql("postgres", &format!("CREATE DATABASE {name}"));
        self.url(&name)
    }

    /// Runs SQL with `psql` in `db`; its unaligned output.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let output = self.psql_output(db, sql);
        assert!(
            output.status.success(),
            "psql {sql:?}: {}",
            describe(&output)
        );
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }

    /// Runs SQL with `psql`; the raw result (for statements that must fail).
    pub fn psql_output(&self, db: &str, sql: &str) -> Output {
        Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", db, "-c", sql])
            .output()
            .unwrap()
    }

    /// Turns TLS on with `cert_pem`/`key_pem` and from then on accepts TCP
    /// connections only over TLS (`hostssl` in `pg_hba.conf`); returns once
    /// a new session sees `ssl = on`.
    pub fn require_tls(&self, cert_pem: &str, key_pem: &str) {
        let data = self.data();
        let files = [
            ("server.crt", cert_pem),
            ("server.key", key_pem),
            (
                "pg_hba.conf",
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
            ),
        ];
        for (name, text) in files {
            let path = data.join(name);
            std::fs::write(&path, text).unwrap();
            // The server refuses a key others may read.
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            if self.as_postgres {
                run_ok(Command::new("chown").arg("postgres:").arg(&path));
            }
        }
        self.psql("postgres", "ALTER SYSTEM SET ssl = on");
        self.psql("postgres", "SELECT pg_reload_conf()");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while self.psql("postgres", "SHOW ssl") != "on" {
            assert!(
                std::time::Instant::now() < deadline,
                "ssl not on after the reload"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The directory the server lives in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn run_ok(command: &mut Command) {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}",
        describe(&output)
    );
}

fn describe(output: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
