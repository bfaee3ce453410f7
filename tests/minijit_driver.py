"""A process that hosts one reference-runtime object, for the truth table.

argv[1] is a JSON configuration; each stdin line is a request, each stdout line its answer.
The runtime is observed by cacheaudit's minijit adapter, as a user would install it.
"""

from __future__ import annotations

import json
import os
import sys

from cacheaudit.runtimes.deepjit import minijit as adapter
from fixtures.minijit import CompilerOptions, Config, DeepJITError, Runtime, SimulatedCrash


def main() -> None:
    config = json.loads(sys.argv[1])
    # The env prefix the library chose (`deep_jit::Config`); the truth table's is DeepGEMM's.
    runtime = Runtime(Config(config["root"], config.get("prefix", "DG"),
                             include_dirs=config["include_dirs"],
                             include_prefixes=config["include_prefixes"]),
                      backend=config["backend"],
                      command_form=config.get("command_form", "joined"))
    adapter.install(runtime)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "crash":
            # The next miss dies between the compile and the commit, leaving its build behind.
            runtime.crash_before_commit = True
            print(json.dumps({"event": "crash"}), flush=True)
            continue
        if request["op"] == "setenv":
            # Changes the process's environment after the runtime read its configuration.
            os.environ[request["name"]] = request["value"]
            print(json.dumps({"event": "setenv"}), flush=True)
            continue
        try:
            options = (CompilerOptions(post_hook=request["post_hook"])
                       if request.get("post_hook") else None)
            kernel = runtime.compile(request["name"], request["source"], options=options)
            answer = {"event": kernel.event, "key": kernel.key, "path": kernel.path,
                      "binary": kernel.binary}
        except DeepJITError as exc:
            answer = {"event": "error", "error": str(exc)}
        except SimulatedCrash as exc:
            # As a killed process: no cleanup, no answer but where it died.
            print(json.dumps({"event": "killed", "path": exc.tmp_dir}), flush=True)
            os._exit(137)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
