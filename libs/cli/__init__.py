"""The `gpupool` command. `main.py` is the registry: it builds the parser and lets each command group add its own
commands through `register(sub, add)`, in the order `gpupool --help` lists them.

  main.py        the registry, and the platform commands (up, down, status, sim, bench, agent, schemas, ...)
  common.py      exit codes, flag value sets, UsageError, durations and times, the client, run_api, Adder
  render.py      tables, key/value blocks, emit and the report output formats (table, JSON, CSV), formatting
  spec.py        a job's spec from a YAML file (-f) and flags
  work.py        submit, run, logs                 services.py   endpoints, load, update
  jobs.py        jobs, describe, explain, scale, cancel, complete
  pool.py        nodes, pool, top; node, cordon, uncordon, drain, sharing, gpu-health, orphans
  quota.py       teams, quota, priority-classes, approvals, reclaim-policies
  reports.py     usage, report usage|efficiency|waste, cost-rates   capacity.py  report capacity, history export
  tokens.py      token, audit, whoami              decisions.py  decisions list|show|replay
  completion.py  completion bash|zsh

Groups import only common, render and the modules below them, never main (the `cli-layers` contract in
.importlinter); tests/unit/test_room_sizes.py keeps every module of libs/ and services/ under 800 lines and every
function under 100.

The people-facing commands:

  gpupool submit      submit a job from flags or a YAML file (-f job.yaml): one node, a gang, or replicas;
                      with -- CMD ARGS the node's agent runs it
  gpupool run         run a command on pool GPUs: submit, stream its output, exit with its exit code
  gpupool logs        a job's output (stdout, stderr; -f follows it)
  gpupool jobs        list jobs            gpupool describe JOB_ID   one job, its history and allocations
  gpupool explain     why a job waits      gpupool scale JOB_ID      change a replicated job's replicas
  gpupool cancel      cancel a job         gpupool complete JOB_ID   mark a running job finished
  gpupool nodes       nodes and GPUs       gpupool pool              per cluster/model: allocated, used, idle
  gpupool top         live per-GPU view    gpupool usage             the GPU-seconds ledger
  gpupool teams       list|create          gpupool quota             list|set|delete quota entries
  gpupool priority-classes  list|set       gpupool reclaim-policies  list|set per job kind
  gpupool approvals   list|approve|deny|rule (admission rules that hold big jobs for a person's approval)
  gpupool token       create|list|revoke   gpupool audit             the audit log (admins)
  gpupool node        one node's GPUs: health state, sharing, holder
  gpupool cordon|uncordon|drain NODE       stop / resume placing on a node; drain also takes its work back
  gpupool sharing NODE GPU MODE            exclusive | fractional | mig      gpupool gpu-health NODE GPU clear|quarantine
  gpupool orphans     processes on GPUs nobody holds; allocations that run no process
  gpupool whoami      the caller's identity, role and allowed actions
  gpupool report      usage|efficiency|capacity|waste (JSON, table or --csv; capacity: forecast and --what-if)
  gpupool history     export: the recorded jobs as a trace `gpupool sim replay` reads
  gpupool cost-rates  list|set|delete prices per GPU model and MIG profile
  gpupool completion  bash|zsh completion script

Every one takes --url / --token (else GPUPOOL_URL / GPUPOOL_TOKEN, else .gpupool/run.json) and -o table|json.
Exit status: 0 ok, 1 the API refused or failed, 2 usage or configuration error, 3 gateway unreachable.
"""
