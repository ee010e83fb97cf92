"""flowernp: A Flower / NumPy app."""

from flwr.app import ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flowernp.task import initial_arrays

# Create ServerApp
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    num_rounds = int(context.run_config["num-server-rounds"])
    min_nodes = int(context.run_config["min-nodes"])
    strategy = FedAvg(
        fraction_evaluate=float(context.run_config["fraction-evaluate"]),
        min_train_nodes=min_nodes,
        min_available_nodes=min_nodes,
    )
    strategy.start(
        grid=grid,
        initial_arrays=initial_arrays(),
        train_config=ConfigRecord({"lr": float(context.run_config["lr"])}),
        num_rounds=num_rounds,
    )
