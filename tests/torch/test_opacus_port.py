"""Opacus code ported line for line: the MNIST example and a Hugging Face fine-tuning loop.

Each Opacus line is kept as a comment above its dpcore form. The data are synthetic (MNIST
shaped; token ids with padding masks), so nothing is downloaded; ``transformers`` is not a
dependency, so a small module with Hugging Face's signature stands in for BERT. Both runs print
epsilon as the examples do, and the printed number must be the ledger's certified PLD bound.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from dpcore.torch.loaders import LotLoader
from dpcore.torch.private import make_private

DELTA = 1e-5


class SampleConvNet(nn.Module):
    """Opacus' examples/mnist.py model, unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, 2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, 2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.relu(self.conv1(x))  # -> [B, 16, 14, 14]
        x = nn.functional.max_pool2d(x, 2, 1)  # -> [B, 16, 13, 13]
        x = nn.functional.relu(self.conv2(x))  # -> [B, 32, 5, 5]
        x = nn.functional.max_pool2d(x, 2, 1)  # -> [B, 32, 4, 4]
        x = x.view(-1, 32 * 4 * 4)  # -> [B, 512]
        x = nn.functional.relu(self.fc1(x))  # -> [B, 32]
        return self.fc2(x)  # -> [B, 10]


def test_opacus_mnist_example_ported_prints_the_ledgers_pld_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.manual_seed(0)
    images = torch.rand(64, 1, 28, 28)  # MNIST shaped, normalised as the example does
    images = (images - 0.1307) / 0.3081
    labels = torch.randint(0, 10, (64,))
    batch_size, epochs, sigma, max_per_sample_grad_norm = 16, 2, 1.1, 1.0
    # train_loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, ...)
    train_loader = LotLoader(
        TensorDataset(images, labels), sampling_probability=batch_size / 64, seed=0
    )
    model = SampleConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0)
    # privacy_engine = PrivacyEngine(secure_mode=False)
    # model, optimizer, train_loader = privacy_engine.make_private(module=model,
    #     optimizer=optimizer, data_loader=train_loader, noise_multiplier=sigma,
    #     max_grad_norm=max_per_sample_grad_norm)
    model, optimizer, train_loader = make_private(
        model,
        optimizer,
        train_loader,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),  # criterion = nn.CrossEntropyLoss()
        noise_multiplier=sigma,
        max_grad_norm=max_per_sample_grad_norm,
        seed=0,
    )
    for epoch in range(1, epochs + 1):
        # def train(args, model, device, train_loader, optimizer, privacy_engine, epoch):
        model.train()
        losses = []
        # for _batch_idx, (data, target) in enumerate(tqdm(train_loader)):
        for micro in train_loader:
            # optimizer.zero_grad(); output = model(data); loss = criterion(output, target)
            # loss.backward(); optimizer.step()
            result = optimizer.step(micro)
            if result is not None and result.lot_size:
                losses.append(result.loss)  # losses.append(loss.item())
        # epsilon = privacy_engine.accountant.get_epsilon(delta=args.delta)
        epsilon = optimizer.epsilon(delta=DELTA)
        print(f"Train Epoch: {epoch} \t Loss: {np.mean(losses):.6f} (ε = {epsilon!r}, δ = {DELTA})")
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == epochs
    final = float(printed[-1].split("ε = ")[1].split(",")[0])
    assert final == optimizer.ledger.epsilon(delta=DELTA, accountant="pld")
    assert optimizer.ledger.steps == epochs * len(train_loader) == 8
    statement = optimizer.privacy_statement(delta=DELTA)
    assert statement["default_accountant"] == "pld"
    assert statement["epsilon"]["pld"]["epsilon"] == final


class TinyBertForSequenceClassification(nn.Module):
    """Hugging Face's signature: ``model(input_ids, attention_mask, labels=None)``."""

    def __init__(self, vocab: int = 30, width: int = 8) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(vocab, width)
        self.classifier = nn.Linear(width, 2)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        mask = attention_mask.unsqueeze(-1).to(self.embeddings.weight.dtype)
        pooled = (self.embeddings(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1)
        outputs = {"logits": self.classifier(pooled)}
        if labels is not None:
            outputs["loss"] = nn.functional.cross_entropy(outputs["logits"], labels)
        return outputs


def _tokenized(count: int) -> list[dict[str, torch.Tensor]]:
    """A tokenized dataset with padding (what ``datasets.map(tokenizer)`` gives)."""
    generator = torch.Generator().manual_seed(3)
    records = []
    for _ in range(count):
        length = int(torch.randint(3, 12, (), generator=generator))
        ids = torch.randint(1, 30, (12,), generator=generator)
        mask = (torch.arange(12) < length).long()
        records.append({"input_ids": ids * mask, "attention_mask": mask, "labels": ids[0] % 2})
    return records


def test_hugging_face_loop_with_masks_and_a_scheduler_ported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    torch.manual_seed(0)
    train_dataset = _tokenized(48)
    model = TinyBertForSequenceClassification()
    # optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    # train_dataloader = DataLoader(train_dataset, batch_size=8, collate_fn=collator)
    train_dataloader = LotLoader(
        train_dataset, sampling_probability=8 / 48, max_physical_batch_size=4, seed=1
    )
    # model, optimizer, train_dataloader = privacy_engine.make_private_with_epsilon(
    #     module=model, optimizer=optimizer, data_loader=train_dataloader,
    #     target_epsilon=8.0, target_delta=DELTA, epochs=2, max_grad_norm=0.1)
    model, optimizer, train_dataloader = make_private(
        model,
        optimizer,
        train_dataloader,
        loss_fn=lambda outputs, labels: nn.functional.cross_entropy(
            outputs["logits"], labels, reduction="none"
        ),
        target_epsilon=8.0,
        target_delta=DELTA,
        epochs=2,
        max_grad_norm=0.1,
        seed=1,
    )
    total = 2 * len(train_dataloader)
    # scheduler = get_linear_schedule_with_warmup(optimizer, 2, total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / 2, max(0.0, (total - step) / (total - 2)))
    )
    rates = []
    for epoch in range(2):
        model.train()
        # for batch in train_dataloader:  # dicts: input_ids, attention_mask, labels
        for micro in train_dataloader:
            # outputs = model(**batch); outputs.loss.backward(); optimizer.step()
            result = optimizer.step(micro)
            if result is not None:
                scheduler.step()  # once per logical batch, as with Opacus
                rates.append(optimizer.param_groups[0]["lr"])
        eps = optimizer.epsilon(delta=DELTA)
        print(f"Epoch {epoch}: eps = {eps!r}")
    printed = float(capsys.readouterr().out.splitlines()[-1].split("eps = ")[1])
    assert printed == optimizer.ledger.epsilon(delta=DELTA, accountant="pld")
    assert printed <= 8.0  # the plan held: no budget warning (warnings are errors here)
    assert len(rates) == total and rates[-1] == 0.0 and max(rates) == pytest.approx(5e-4)
    assert math.isfinite(result.accuracy)


def test_opacus_tutorial_table_names_exist() -> None:
    """Every ``optimizer.X`` / ``data_loader.X`` the Opacus tutorial's table promises is there."""
    import re
    from pathlib import Path

    tutorial = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "from-opacus.md"
    section = tutorial.read_text(encoding="utf-8").split("## Everything else, line by line")[1]
    table = section.split("\n\n")[2]
    names = set(re.findall(r"`(optimizer|data_loader)\.(\w+)", table))
    assert {("optimizer", "max_grad_norm"), ("data_loader", "sample_rate")} <= names
    model = nn.Linear(3, 2)
    loader = LotLoader(
        TensorDataset(torch.randn(8, 3), torch.randint(0, 2, (8,))), sampling_probability=0.5
    )
    _, optimizer, loader = make_private(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader,
        loss_fn=nn.CrossEntropyLoss(reduction="none"),
        noise_multiplier=1.0,
        max_grad_norm=1.0,
    )
    objects = {"optimizer": optimizer, "data_loader": loader}
    missing = [f"{kind}.{name}" for kind, name in names if not hasattr(objects[kind], name)]
    assert not missing
