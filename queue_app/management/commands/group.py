"""manage.py group: a group's progress and its members."""

from queue_app.ops import cli, workflows


class Command(cli.QueueCommand):
    help = "Show a job group's progress (n of m ended, completed, dead, cancelled), its callback and members."
    epilog = """examples:
  manage.py group 7
  manage.py group 7 --json | jq '.completed, .total'

--json prints one object: id, name, policy, status (open, succeeded, failed), total, ended,
completed, dead_letter, cancelled, callback (the template), callback_job, callback_error,
created_at, fired_at, closed_at, members [{id, kind, state, status}]. Exit status 2 if
the group does not exist."""

    def add_arguments(self, parser):
        parser.add_argument("group_id", type=cli.job_id, metavar="ID", help="The group's id.")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args, **o):
        data = workflows.group(o["group_id"])
        if data is None:
            raise cli.bad_input(f"group {o['group_id']} does not exist")
        if o["json"]:
            self.stdout.write(cli.dumps(data))
            return
        name = f" ({data['name']})" if data["name"] else ""
        self.stdout.write(
            f"group {data['id']}{name}: {data['status']}, {data['ended']} of {data['total']} ended "
            f"({data['completed']} completed, {data['dead_letter']} dead_letter, {data['cancelled']} cancelled); "
            f"policy {data['policy']}"
        )
        if data["callback_job"] is not None:
            self.stdout.write(f"callback: job {data['callback_job']}")
        elif data["callback_error"]:
            self.stdout.write(f"callback refused: {data['callback_error']}")
        elif data["callback"]:
            self.stdout.write(f"callback: {data['callback']['kind']}, not enqueued yet")
        for m in data["members"]:
            self.stdout.write(f"  {m['id']:>8}  {m['status']:<12} {m['kind']}")
