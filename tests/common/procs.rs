//! Running the real `pi0d` binary as a child process the test talks to while it runs: signals,
//! pipes closed under it, a thread limit (a pids cgroup) around it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn pi0d() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pi0d"));
    c.env("RUST_LOG", "info");
    c
}

/// Writes `cfg` as `dir/config.toml`.
pub fn write_config(dir: &Path, cfg: &toml::Table) -> PathBuf {
    let path = dir.join("config.toml");
    std::fs::write(&path, toml::to_string(cfg).unwrap()).unwrap();
    path
}

/// `pi0d run --quiet --config CFG --duration D --summary dir/summary.json`, not started.
pub fn run_command(dir: &Path, cfg: &toml::Table, duration_s: f64) -> Command {
    let cfg = write_config(dir, cfg);
    let mut c = pi0d();
    c.args(["run", "--quiet", "--config"])
        .arg(cfg)
        .args(["--duration", &duration_s.to_string(), "--summary"])
        .arg(dir.join("summary.json"));
    c
}

/// The summary a run left in `dir`, if any.
pub fn summary_in(dir: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("summary.json")).ok()?;
    Some(serde_json::from_str(&text).expect("summary is JSON"))
}

/// Waits for `child` up to `limit_s`; kills it and panics past that.
pub fn wait_for_exit(child: &mut Child, limit_s: f64) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs_f64(limit_s);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("pi0d still running after {limit_s} s: killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn send_signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(r, 0, "kill({}, {sig})", child.id());
}

/// A child whose stderr a thread collects while it runs.
pub struct Watched {
    pub child: Child,
    stderr: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Watched {
    /// Starts `cmd` with stderr piped into a collecting thread.
    pub fn start(mut cmd: Command) -> Watched {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("pi0d starts");
        let mut pipe = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Watched {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until stderr contains `text` (panics after `limit_s`, or if the child exits first).
    pub fn wait_for_log(&mut self, text: &str, limit_s: f64) {
        let deadline = Instant::now() + Duration::from_secs_f64(limit_s);
        while !self.stderr().contains(text) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "pi0d exited ({status}) before logging {text:?}:\n{}",
                    self.stderr()
                );
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("no {text:?} within {limit_s} s:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the exit (at most `limit_s`), then for the rest of stderr.
    pub fn finish(mut self, limit_s: f64) -> (ExitStatus, String) {
        let status = wait_for_exit(&mut self.child, limit_s);
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        (status, self.stderr())
    }
}

/// A pipe whose read end the test holds (or closes); the write end goes to the child.
pub fn pipe() -> (std::fs::File, Stdio) {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`, which we then own.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0, "pipe2");
    use std::os::fd::FromRawFd;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            Stdio::from(std::os::fd::OwnedFd::from_raw_fd(fds[1])),
        )
    }
}

/// Sets O_NONBLOCK on `f` (to read what a pipe holds without waiting for more).
pub fn set_nonblocking(f: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor `f` owns.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        assert!(flags >= 0);
        assert_eq!(
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK),
            0
        );
    }
}

/// A pids cgroup limiting how many tasks (threads) the processes in it may have; removed on
/// drop (after the processes in it ended).
pub struct PidsCgroup {
    dir: PathBuf,
}

impl PidsCgroup {
    /// A new cgroup `name` under the v1 pids controller, or else under cgroup v2; `Err` says
    /// why neither could be made.
    pub fn create(name: &str, max: u32) -> Result<PidsCgroup, String> {
        let mut why = Vec::new();
        for parent in [
            "/sys/fs/cgroup/pids",
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
        ] {
            let parent = Path::new(parent);
            if !parent.join("cgroup.procs").exists() {
                why.push(format!("{}: no cgroup hierarchy", parent.display()));
                continue;
            }
            let v2 = parent.join("cgroup.controllers").exists();
            if v2 {
                let controllers = std::fs::read_to_string(parent.join("cgroup.subtree_control"))
                    .unwrap_or_default();
                if !controllers.split_whitespace().any(|c| c == "pids") {
                    // Enabling it fails where the parent has processes of its own ("no internal
                    // processes"); then this hierarchy cannot be used.
                    let _ = std::fs::write(parent.join("cgroup.subtree_control"), "+pids");
                }
            }
            let dir = parent.join(name);
            // A leftover of an earlier run with the same pid (empty: it can go).
            let _ = std::fs::remove_dir(&dir);
            if let Err(e) = std::fs::create_dir(&dir) {
                why.push(format!("mkdir {}: {e}", dir.display()));
                continue;
            }
            let group = PidsCgroup { dir };
            match std::fs::write(group.dir.join("pids.max"), max.to_string()) {
                Ok(()) => return Ok(group),
                Err(e) => why.push(format!("{}/pids.max: {e}", group.dir.display())),
            }
        }
        Err(why.join("; "))
    }

    /// `program args...`, started inside the cgroup (the shell moves itself in, then execs).
    pub fn command(&self, program: &Path, args: &[std::ffi::OsString]) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
                self.dir.display()
            ))
            .arg(program)
            .args(args)
            .env("RUST_LOG", "info");
        c
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        // The last task leaving is noticed asynchronously: retry briefly.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("cannot remove cgroup {}", self.dir.display());
    }
}
