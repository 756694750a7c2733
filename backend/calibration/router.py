"""HTTP: calibration — the planner's error on finished runs and gpu-check results, and its opt-in correction."""
from fastapi import APIRouter

from backend.api.deps import SessionDep
from backend.auth.deps import Admin, Reader
from backend.calibration import service
from backend.calibration.schemas import Calibration, CorrectedEstimate, LoadResult
from backend.core.settings import get_settings
from plan import Plan

router = APIRouter(prefix="/api/calibration", tags=["calibration"])


@router.get("")
def calibration(session: SessionDep, _: Reader) -> Calibration:
    """Predicted vs measured for every finished run and gpu-check row, the error per GPU type and per feature
    set, and each GPU type's fitted correction with its residual (applied only through /estimate, on request)."""
    return Calibration.model_validate(service.summary(session))


@router.post("/estimate")
def calibrated_estimate(plan: Plan, session: SessionDep, _: Reader) -> CorrectedEstimate:
    """The plan's estimate and, beside it, its figures with the GPU type's fitted corrections (opt-in)."""
    return CorrectedEstimate.model_validate(service.corrected(session, plan.effective()))


@router.post("/load")
def load(session: SessionDep, _: Admin) -> LoadResult:
    """Read ULAB_CALIBRATION_DIR's gpu-*.csv files (from `make gpu-check`) again as measured rows."""
    directory = get_settings().calibration_dir
    rows = service.load_results(session, directory)
    session.commit()
    return LoadResult(rows=rows, directory=str(directory))
