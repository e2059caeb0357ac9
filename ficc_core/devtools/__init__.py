"""Development tools: the generators that keep the reference sections of ``docs/`` current."""
