"""`fab check`: validate the profile and run the whole preflight on each host; launch nothing.

    fab check [--json]

The same checks as deploy's preflight (tasks/steps/preflight.py), one line each; exit 1 when
any FAILs. `--json`: one object per host, `{host, ok, checks: [{status, check, message}], findings}`
(findings: the speculative-decoding doctor's, tasks/doctor/findings.py); a FAIL adds `error`
and `code`, an unreachable host is `{host, ok: false, error, code}`.
"""
from .doctor.findings import split
from .fleet.fanout import HostResult
from .steps.preflight import deploy_dir, exposure_checks, preflight_request, ray_port_checks, run_preflight, secret_checks


def check(c, opts):
    """Body of `fab check` (opts: tasks.options.CheckOptions)."""
    from .fleet.runner import load, run_task
    profile = load(c, opts.profile)

    def op(host, reporter):
        hello = host.start()
        reporter.line(host.name, f"connected: {hello['user']}@{hello['hostname']}")
        state = host.call("state", deploy_dir=deploy_dir(profile))
        record = {"host": host.name, "ok": True, "checks": [], "findings": []}
        # A FAIL raises PreflightFailed, whose --json object (ok false, checks, findings) the
        # fan-out prints (tasks/fleet/fanout.py error_record), as for an unreachable host.
        extra = exposure_checks(profile) + ray_port_checks(profile) + secret_checks(profile)
        checks = run_preflight(host, reporter, preflight_request(profile, state), extra)["checks"]
        record["checks"], record["findings"] = split(checks)  # the doctor's (tasks/doctor/findings.py)
        if opts.json:
            reporter.emit_json(record)
        warns = sum(c["status"] == "WARN" for c in checks)
        return HostResult(host.name, 0, f"{len(checks)} checks OK" + (f", {warns} warning(s)" if warns else ""))
    run_task(c, profile, op, opts, title="check", json_mode=opts.json)
