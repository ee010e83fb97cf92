"""Connected nodes, the tasks handed to them, and what came back."""
