"""HTTP: sign in with a token (kept in an httpOnly cookie for the browser), and token management (admin)."""
from fastapi import APIRouter, Request, Response

from backend.api.deps import RowId, SessionDep
from backend.auth import service
from backend.auth.deps import COOKIE, Admin, Reader
from backend.auth.schemas import Identity, SignIn, TokenCreate, TokenCreated, TokenOut
from backend.core.errors import NotFound, UserError

router = APIRouter(prefix="/api", tags=["access"])


@router.post("/session")
def sign_in(body: SignIn, response: Response, session: SessionDep) -> Identity:
    """Check a token and open a session of it: a token of its own, acting as the one given, kept in an httpOnly,
    SameSite=Strict cookie (the dashboard and its SSE use it); sign-out revokes it."""
    principal = service.verify(session, body.token)
    if principal is None:
        raise UserError(401, "token", "the API token is unknown or revoked")
    cookie = service.open_session(session, principal)
    response.set_cookie(COOKIE, cookie, httponly=True, samesite="strict", max_age=service.SESSION_TTL_S, path="/")
    return Identity(name=principal.name, role=principal.role, token_id=principal.token_id)


@router.get("/session")
def whoami(user: Reader) -> Identity:
    return Identity(name=user.name, role=user.role, token_id=user.token_id)


@router.delete("/session", status_code=204)
def sign_out(request: Request, response: Response, session: SessionDep) -> None:
    """Revoke the cookie's session token and drop the cookie."""
    cookie = request.cookies.get(COOKIE)
    if cookie:
        service.close_session(session, cookie)
    response.delete_cookie(COOKIE, path="/")


@router.post("/tokens", status_code=201)
def create_token(body: TokenCreate, session: SessionDep, _: Admin) -> TokenCreated:
    try:
        row, token = service.create_token(session, body.name, body.role, body.queues)
    except ValueError as e:
        raise UserError(422, "queues", str(e)) from None
    return TokenCreated(**TokenOut.model_validate(row).model_dump(), token=token)


@router.get("/tokens")
def list_tokens(session: SessionDep, _: Admin) -> list[TokenOut]:
    return [TokenOut.model_validate(t) for t in service.list_tokens(session)]


@router.delete("/tokens/{token_id}")
def revoke_token(token_id: RowId, session: SessionDep, _: Admin) -> TokenOut:
    row = service.revoke(session, token_id)
    if row is None:
        raise NotFound("token", token_id)
    return TokenOut.model_validate(row)
