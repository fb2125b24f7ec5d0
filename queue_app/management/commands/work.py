"""manage.py work: the seed's name for runworker; same flags."""

from queue_app.management.commands.runworker import Command as RunWorker


class Command(RunWorker):
    help = "Alias of runworker. " + RunWorker.help
