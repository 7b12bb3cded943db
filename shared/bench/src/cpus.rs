//! REDIRECT_CPU: the redirector on a CPU of its own and everything else the bench runs (the
//! load, the collector, PostgreSQL) on the others, so that the host's cost is measured without
//! PostgreSQL and the load on the redirector's core (production has PostgreSQL on another
//! machine). CPUs are numbered from 0 to the count this process may use, less one.

use std::process::Command;

use crate::Res;

/// The CPUs this process may use.
pub(crate) fn count() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Which CPU the redirector gets: REDIRECT_CPU's value, checked against the CPUs this process
/// may use (at least one must be left for the rest).
pub(crate) fn parse(value: &str, count: usize) -> Res<usize> {
    if count < 2 {
        return Err(format!(
            "REDIRECT_CPU: this machine lets the bench use {count} CPU, none would be left for \
             the rest"
        )
        .into());
    }
    match value.trim().parse::<usize>() {
        Ok(cpu) if cpu < count => Ok(cpu),
        _ => Err(format!(
            "REDIRECT_CPU must be a CPU number from 0 to {}, not {value:?}",
            count - 1
        )
        .into()),
    }
}

/// The CPUs other than `cpu` of `0..count`, as taskset writes a list.
fn others(cpu: usize, count: usize) -> String {
    let list: Vec<String> = (0..count)
        .filter(|&c| c != cpu)
        .map(|c| c.to_string())
        .collect();
    list.join(",")
}

/// Moves every thread of this process and of PostgreSQL's processes (the postmaster and its
/// children; backends forked later inherit it) off `cpu`. The collector, started later by
/// this process, inherits it too.
pub(crate) fn keep_off(cpu: usize, count: usize, postmaster: i32) -> Res<()> {
    let list = others(cpu, count);
    let mut pids = vec![std::process::id() as i32, postmaster];
    pids.extend(testkit::pgtest::children_of(postmaster));
    for pid in pids {
        let out = Command::new("taskset")
            .args(["-a", "-p", "-c", &list, &pid.to_string()])
            .output()
            .map_err(|e| format!("taskset: {e}"))?;
        // A backend that exited meanwhile (autovacuum's, say) has nothing left to move.
        let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists();
        if !out.status.success() && !gone {
            return Err(format!(
                "taskset -a -p -c {list} {pid}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
    }
    Ok(())
}

/// `program` run on `cpu` alone (its runtime then starts one worker).
pub(crate) fn on(cpu: usize, program: &std::path::Path) -> Command {
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", &cpu.to_string()]).arg(program);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_must_exist_and_leave_one() {
        assert_eq!(parse("1", 2).unwrap(), 1);
        assert!(parse("2", 2).is_err());
        assert!(parse("x", 4).is_err());
        assert!(parse("0", 1).is_err());
        assert_eq!(others(1, 4), "0,2,3");
    }
}
