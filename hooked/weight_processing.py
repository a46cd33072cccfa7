"""Weight processing (folding, centering) -- placeholder until implemented."""


def process_state_dict(model, state_dict, **flags):
    if any(flags.values()):
        raise NotImplementedError(f"weight processing not implemented yet: {flags}")
    return state_dict
