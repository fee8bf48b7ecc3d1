"""Write docs/top.svg, the Operations page's screenshot of `gmlx top`, from the recorded busy snapshot.

    .venv/bin/python -m tests.top.screenshot [PATH]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tests.top.fakes import SIZE, app_for, busy_minute, poll
from tests.top.promql import ROOT


async def save(path: Path) -> None:
    script = busy_minute()
    app, _ = app_for(script)
    async with app.run_test(size=SIZE) as pilot:
        await poll(app, len(script))
        await pilot.pause()
        app.save_screenshot(path.name, str(path.parent))


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "top.svg"
    target.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(save(target))
    print(target)
