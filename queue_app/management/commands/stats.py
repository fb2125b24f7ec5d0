"""manage.py stats: the same as status (QueueCTL's name for it)."""

from queue_app.management.commands.status import Command as Status


class Command(Status):
    help = "Alias of status: " + Status.help
