"""The errors of the fusebox package.

Every error names what is at fault: a spec error the JSON path of the field, an
unsupported module its place in the torch module and its class, a file error
the file, an API error the server's stable error code and the field it names.
"""


class FuseboxError(Exception):
    """The base of every error this package raises."""


class SpecError(FuseboxError, ValueError):
    """A model or job spec that fusebox would refuse.

    field is the JSON path at fault, as the server writes it
    (``model.layers[1].out``).
    """

    def __init__(self, field, message):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class UnsupportedModule(FuseboxError, TypeError):
    """A torch module that has no fusebox layer.

    path is where the module sits (``module[3]``, ``module[2].body[0]``) and
    module the offending module itself.
    """

    def __init__(self, path, module, reason):
        self.path = path
        self.module = module
        self.reason = reason
        super().__init__(f"{path} ({type(module).__name__}): {reason}")


class FileFormatError(FuseboxError, ValueError):
    """A file that is not a fusebox model or checkpoint, or is damaged."""

    def __init__(self, path, message):
        self.path = str(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")


class ApiError(FuseboxError):
    """An error answer of the fusebox REST API.

    status is the HTTP status, code the stable error code of base/errors.h
    (``unknown_field``, ``not_found``, ...), field the JSON path, query
    parameter or header the server names (None when it names none).
    """

    def __init__(self, status, code, message, field=None, method=None, url=None):
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.method = method
        self.url = url
        where = f" at {field}" if field else ""
        super().__init__(f"{status} {code}{where}: {message}")
