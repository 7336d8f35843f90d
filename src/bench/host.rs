//! The machine a benchmark ran on, for the report.

use std::fmt;

#[derive(Debug, Clone)]
pub struct Host {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub rustc: String,
    pub medea: String,
    /// 1-minute load average when the benchmark started (other work on the machine).
    pub load: String,
}

fn first_line(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.lines().next().map(str::to_string))
}

impl Host {
    pub fn detect() -> Host {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let rustc = std::process::Command::new("rustc")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown (rustc not on PATH)".into());
        Host {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            kernel: first_line("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
            rustc,
            medea: crate::build_info::LONG_VERSION.to_string(),
            load: first_line("/proc/loadavg")
                .and_then(|l| l.split_whitespace().next().map(str::to_string))
                .unwrap_or_else(|| "unknown".into()),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "host: {} CPUs, {}", self.nproc, self.cpu_model)?;
        writeln!(
            f,
            "      Linux {}, {}, medea {}",
            self.kernel, self.rustc, self.medea
        )?;
        write!(f, "      load average (1 min) at start: {}", self.load)
    }
}
