"""Tools of your own for `--tool examples.my_tools:NAME`: plain functions whose name, type hints and docstring
become the schema the model sees (docs/agents.md)."""


def word_count(text: str) -> int:
    """Count the words in a text.

    Args:
        text: The text to count the words of.
    """
    return len(text.split())


class Counter:
    """An environment (`--environment examples.my_tools:Counter`): one instance per rollout, `reset` at its start,
    its public methods are the tools the model may call."""

    def reset(self, **row) -> None:
        self.total = 0

    def add(self, amount: int) -> str:
        """Add to this conversation's running total and return the new total.

        Args:
            amount: The whole number to add.
        """
        self.total += int(amount)
        return str(self.total)
