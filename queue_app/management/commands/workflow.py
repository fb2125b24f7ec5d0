"""manage.py workflow: a job's place in a workflow: what it waits for, what waits for it."""

from queue_app.ops import cli, workflows


class Command(cli.QueueCommand):
    help = "Show the jobs a job depends on and the jobs that depend on it, with their states."
    epilog = """examples:
  manage.py workflow 42
  manage.py workflow 42 --json

--json prints one object: id, kind, state, waiting_for (its dependencies not ended yet),
depends {policy, pass, held}, group, upstream [{id, kind, state, status}], dependents
[...]. Exit status 2 if the job does not exist."""

    def add_arguments(self, parser):
        parser.add_argument("job_id", type=cli.job_id, metavar="ID", help="The job's id.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args, **o):
        data = workflows.dependencies(o["job_id"])
        if data is None:
            raise cli.bad_input(f"job {o['job_id']} does not exist")
        if o["json"]:
            self.stdout.write(cli.dumps(data))
            return
        line = f"job {data['id']}: {data['kind']}, {data['state']}"
        if data["state"] == "waiting":
            held = (data["depends"] or {}).get("held")
            line += ", held (a dependency failed)" if held else f", waiting for {data['waiting_for']}"
        if data["group"] is not None:
            line += f", in group {data['group']}"
        self.stdout.write(line)
        for title, rows in (("depends on", data["upstream"]), ("depended on by", data["dependents"])):
            self.stdout.write(f"{title}:" + ("" if rows else " nothing"))
            for m in rows:
                self.stdout.write(f"  {m['id']:>8}  {m['status']:<12} {m['kind']}")
